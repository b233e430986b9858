"""Side-by-side benchmarks of Tempo against peer systems (see benchmarks/README.md)."""
