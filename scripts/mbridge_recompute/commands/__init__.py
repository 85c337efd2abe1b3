"""Argument glue for each subcommand: parse options, call the logic, render."""
