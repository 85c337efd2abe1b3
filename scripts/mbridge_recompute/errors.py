"""Exit codes and the two error types every tool raises at its edge.

The command-line contract (references/cli-reference.md, "Exit codes"), one meaning per code:

* 0 -- ok.
* 1 -- the input was read and understood, and the tool rejects it or found a problem
  (a constraint violated, a sweep whose runs would not be matched, a run or a test that
  failed, nothing that fits). `Rejected` is raised for the refusals that stop a tool early.
* 2 -- the tool cannot read the input: a missing, unreadable or empty file, text that is not
  YAML / JSON, a value of the wrong type, an unknown field, label, option or name.
  `InputError` is raised anywhere at the edge.

`cli.main` turns either into its exit code, one `error: FIELD: REASON` line on stderr and, with
`--json`, one `{"error": {...}}` object on stdout.
"""

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2

# One error line stays readable and bounded whatever the input held (a list of a million
# labels must not become a 300 MB line).
MAX_FIELD = 200
MAX_REASON = 600


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def one_line(text: str) -> str:
    """Newlines and other control characters of user input folded, so an error stays one line."""
    return "".join(c if c.isprintable() or c == " " else " " for c in str(text))


def clip_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters in the middle: a field's end names the key."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]}…{text[len(text) - (limit - head - 1):]}"


class InputError(Exception):
    """Input the tool cannot read. `field` names what is wrong, as the user spelled it."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, field: str, reason: str):
        self.field = clip_middle(one_line(field), MAX_FIELD)
        self.reason = clip(one_line(reason), MAX_REASON)
        super().__init__(f"{self.field}: {self.reason}")

    def line(self) -> str:
        return f"error: {self.field}: {self.reason}"

    def to_dict(self) -> dict:
        return {"error": {"field": self.field, "message": self.reason, "exit": self.exit_code}}


class Rejected(InputError):
    """Input that was read and understood, and that the tool refuses (exit 1)."""

    exit_code = EXIT_PROBLEM
