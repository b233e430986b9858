"""Polyhedral facts about an SDG that the passes and the scheduler both need: the program
as isl statements and read relations (``polyhedral``), and the points it needs
(``needed``). Statements are named from op ids (``statement_name``); ids are never read
back out of names: a name is looked up from the id it was made from."""
