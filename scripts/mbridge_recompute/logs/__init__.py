"""Reading runs: log parsing, the matched comparison, OOM and error diagnosis."""
