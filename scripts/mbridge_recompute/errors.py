"""Exit codes and the one error type that means "your input is unusable".

The command-line contract: 0 ok, 1 the tool ran and found a problem, 2 unusable
input with one line naming the field. `InputError` is raised anywhere at the
edge (loading, option parsing) and turned into exit 2 by `cli.main`.
"""

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Unusable input. `field` names what is wrong, as the user spelled it."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def line(self) -> str:
        return f"error: {self.field}: {self.reason}"
