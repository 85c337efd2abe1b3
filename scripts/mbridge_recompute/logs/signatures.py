"""Error strings that name a recompute cause, as data.

Two sources, one lookup:

* the card's `constraints:` (data/card.yaml): every entry whose `message` is real
  upstream text is turned into a matcher here, so the string lives once, in the
  card (`{name}` f-string parts match anything, a trailing `…` matches the rest);
* `RUNTIME` below: strings the card does not carry -- failures raised outside
  `TransformerConfig.__post_init__` (forward-time, module-init, training
  arguments), Megatron-LM `main` rules, and symptoms recognised by exception type
  plus traceback frames. Each cites its upstream line. An entry may name the
  card constraint it is the symptom of (`constraint_id`) when the card states the
  rule but has no matchable message for it (e.g. "runtime only").

A `Signature` matches either any log line (`pattern` only) or an exception
(`exc_type` and/or `frames`: the exception line must match and its traceback
must contain one of the frame functions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

# card `message` values that are markers, not upstream text
_NOT_A_MESSAGE = {"", "runtime only", "silent no-op"}


@dataclass(frozen=True)
class Signature:
    id: str
    kind: str                    # "config" or "runtime"
    pattern: str                 # regex searched in the line / exception message
    fix: str
    source: str
    cause: str = ""
    severity: str = "error"
    constraint_id: Optional[str] = None
    exc_type: Optional[str] = None          # exception class name (last dotted part)
    frames: tuple = ()                      # one of these functions must be in the traceback
    anchor: str = ""                        # literal substring every match contains (fast prefilter)
    message: str = ""                       # the upstream text (line signatures of the runtime table)
    prefix: str = ""                        # literal text before the first {part}, when distinctive

    @property
    def regex(self) -> re.Pattern:
        return _compile(self.pattern)


@lru_cache(maxsize=None)
def _compile(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def message_regex(message: str) -> tuple:
    """(regex, anchor) for an upstream message with `{f-string parts}` and `…` elisions."""
    text = message.strip()
    parts = re.split(r"(\{[^{}]*\}|…|\.\.\.$)", text)
    out, literals = [], []
    for part in parts:
        if not part:
            continue
        if part.startswith("{") and part.endswith("}"):
            out.append(r".*?")
        elif part in ("…", "..."):
            out.append(r".*")
        else:
            literals.append(part.strip())
            out.append(r"\s+".join(re.escape(w) for w in part.split(" ") if w) if part.strip() else r"\s*")
            if part.startswith(" "):
                out[-1] = r"\s*" + out[-1]
            if part.endswith(" "):
                out[-1] = out[-1] + r"\s*"
    anchor = max(literals, key=len, default="")
    # the anchor must survive whitespace differences: take its longest space-free run
    anchor = max(anchor.split(" "), key=len, default="")
    return "".join(out), anchor


def _sig(id, kind, message, fix, source, cause="", **kw) -> Signature:
    pattern, anchor = message_regex(message)
    return Signature(id=id, kind=kind, pattern=pattern, anchor=anchor, fix=fix, source=source,
                     cause=cause, message=message, **kw)


# Strings the card does not carry. Messages are upstream text; `source` is `file:line @ version`
# (0.16.1 = core_v0.16.1, main = Megatron-LM d98e8a6, MLM paths start with megatron/training).
RUNTIME: tuple = (
    # ---- recompute mechanisms (tensor_parallel/random.py, transformer_block.py)
    _sig("checkpoint-with-autograd-grad", "runtime",
         "Checkpointing is not compatible with .grad(), please use .backward() if possible",
         "drive the backward pass with loss.backward() (not torch.autograd.grad) or drop the recompute "
         "for this module", "tensor_parallel/random.py:539,676 @ core_v0.16.1",
         cause="a checkpointed region was differentiated with torch.autograd.grad"),
    Signature(id="uniform-index-error", kind="runtime", constraint_id="uniform-num-layers-not-dividing-chunk",
              pattern=r"index -?\d+ is out of range", anchor="out of range", exc_type="IndexError",
              frames=("_checkpointed_forward", "custom_forward", "_get_layer"),
              cause="full recompute with recompute_method=uniform and a recompute_num_layers that does not "
                    "divide the layers of each model chunk (0.16.1 indexes past the chunk)",
              fix="choose recompute_num_layers dividing the layers per model chunk (num_layers / PP / VPP), "
                  "or use recompute_method=block",
              source="transformer/transformer_block.py:532-542,443-444 @ core_v0.16.1"),
    Signature(id="full-recompute-fp8-without-te", kind="runtime",
              pattern=r"'NoneType' object is not callable",
              anchor="NoneType", exc_type="TypeError", frames=("checkpoint_handler", "_checkpointed_forward"),
              cause="full recompute with fp8/fp4 calls te_checkpoint, which is None without Transformer "
                    "Engine",
              fix="install Transformer Engine, or run full recompute without fp8/fp4",
              source="transformer/transformer_block.py:52,504-519 @ core_v0.16.1"),
    _sig("te-checkpoint-needs-te", "runtime",
         "Transformer Engine is not installed. Please install it with `pip install transformer-engine`.",
         "install Transformer Engine (the fp8/fp4 checkpoint path needs it) or drop fp8/fp4",
         "extensions/transformer_engine.py:2262-2270 @ core_v0.16.1",
         cause="te_checkpoint (fp8/fp4 recompute) without Transformer Engine"),
    _sig("save-original-input-needs-te-2-6", "runtime",
         "set_save_original_input is only needed on transformer-engine modules that save quantized tensors "
         "by default. It needs transformer-engine>=2.6.0dev0.",
         "upgrade Transformer Engine to >= 2.6, or drop layernorm/moe_act from recompute_modules under "
         "fp8/fp4",
         "extensions/transformer_engine.py:2501-2518 @ core_v0.16.1",
         cause="layernorm/moe_act recompute under fp8/fp4 on a Transformer Engine older than 2.6"),
    _sig("layernorm-recompute-attention-override", "runtime",
         "set_for_recompute_input_layernorm is not implemented.",
         "drop layernorm from recompute_modules for this attention class (e.g. cross attention) under fp8",
         "transformer/attention.py:1226-1228 @ core_v0.16.1",
         cause="layernorm recompute with fp8 on an attention class without an override"),
    Signature(id="te-version-none", kind="runtime",
              pattern=r"'>=' not supported between instances of 'NoneType' and 'Version'", anchor="'Version'",
              exc_type="TypeError",
              cause="megatron-core 0.16.1 compares the Transformer Engine version inside __post_init__ "
                    "(fp8 + layernorm/moe_act, fp8 + MoE) and TE is not installed",
              fix="install Transformer Engine (>= 2.6 for fp8 layernorm/moe_act recompute), or drop fp8",
              source="transformer/transformer_config.py:1248,1601,1607 @ core_v0.16.1"),
    # ---- CUDA graphs and EP overlap (transformer_config.py rules the card leaves out)
    _sig("ep-overlap-needs-torch-2-6", "config",
         "A2A Overlap encounters hang issue with torch version < 2.6.0",
         "upgrade torch to >= 2.6 or disable overlap_moe_expert_parallel_comm",
         "transformer/transformer_config.py:1854-1856 @ core_v0.16.1"),
    _sig("delay-wgrad-legacy-grouped-gemm", "config",
         "delay_wgrad_compute is not supported with legacy groupedgemm implementation",
         "set moe_use_legacy_grouped_gemm=false or delay_wgrad_compute=false",
         "transformer/transformer_config.py:1913-1915 @ core_v0.16.1"),
    _sig("delay-wgrad-needs-te-2-10", "config",
         "TE version >= 2.10.0 is required for delay_wgrad_compute with partial cuda graph",
         "upgrade Transformer Engine to >= 2.10, or disable delay_wgrad_compute or the partial CUDA graph",
         "transformer/transformer_config.py:1916-1920 @ core_v0.16.1"),
    _sig("early-attn-release-needs-ep-overlap", "config",
         "overlap_moe_expert_parallel_comm must be enabled when enabling "
         "ep_overlap_early_attn_memory_release",
         "enable overlap_moe_expert_parallel_comm or disable ep_overlap_early_attn_memory_release",
         "transformer/transformer_config.py:1922-1926 @ core_v0.16.1"),
    _sig("gtp-graph-shared-experts-fp8", "config",
         "GTP + local CUDA graphs that capture shared_experts (moe_router/moe scope) cannot recompute it "
         "under fp8/fp4: …",
         "drop shared_experts from recompute_modules, or keep shared experts out of the local CUDA graph",
         "transformer/transformer_config.py:2908-2927 @ main (d98e8a6)"),
    # ---- mhc (Megatron-LM main only)
    _sig("mhc-not-recomputed", "config",
         "HyperConnections are enabled but 'mhc' is not in recompute_modules with selective recompute. "
         "Consider adding 'mhc' …", "add mhc to recompute_modules (selective) if hyper-connection "
         "activations dominate", "transformer/transformer_config.py:2053-2060 @ main (d98e8a6)",
         severity="warning"),
    # ---- the perf harness's command line: argparse (CPython Lib/argparse.py @ 3.11) and Hydra, whose
    # override grammar gets every token argparse leaves (parse_known_args in run_script.py / bootstrap.py)
    _sig("argparse-unrecognized-arguments", "config", "error: unrecognized arguments: {args}",
         "give recompute labels as ONE comma-separated token (--recompute_modules core_attn,moe_act); a word "
         "after a space is not part of the flag. A flag this Bridge release does not have is refused by "
         "run_harness.py, which checks the argv against the release's own flags",
         "Lib/argparse.py:1871,2384 @ CPython 3.11",
         cause="a command line argparse parses in full got a word it does not take: typically the second "
               "label of a space-separated --recompute_modules list"),
    _sig("argparse-invalid-choice", "config", "invalid choice: {value} (choose from {choices})",
         "use one of the listed choices: --task is lora at Bridge 0.5 and peft from 0.6; -c has no fp8_ds "
         "at any release (reach fp8ds recipes through scripts/training/train.sh --recipe)",
         "Lib/argparse.py:2552 @ CPython 3.11; scripts/performance/argument_parser.py:269 @ v0.5.1, "
         ":276 @ v0.6.0",
         cause="a flag value outside the choices of this release's harness parser"),
    _sig("argparse-expected-one-argument", "config", "expected one argument",
         "the flag needs a value; the '[]' control has no flag form: use the Hydra overrides "
         "model.recompute_granularity=selective 'model.recompute_modules=[]' instead of an empty "
         "--recompute_modules", "Lib/argparse.py:2199 @ CPython 3.11",
         cause="a flag given without its value (--recompute_modules at the end of the line, or before "
               "another flag)"),
    _sig("hydra-override-parse-error", "config", "Error parsing override '{override}'",
         "a token Hydra cannot parse reached it: a bare word (\"missing EQUAL\": usually the second label "
         "of a space-separated --recompute_modules list; join the labels with commas) or an unquoted list "
         "the shell split; quote Hydra lists ('model.recompute_modules=[]')",
         "hydra/core/override_parser/overrides_parser.py:95 @ hydra-core 1.3.2; wrapped by "
         "src/megatron/bridge/training/utils/omegaconf_utils.py:179-186 @ 067f987",
         cause="the perf harness hands every token argparse does not take to Hydra's override parser"),
    # ---- Megatron-LM training arguments the card leaves out (megatron/training/arguments.py)
    _sig("checkpoint-activations-removed", "config",
         "--checkpoint-activations is no longer valid, use --recompute-activations, or, for more control, "
         "--recompute-granularity and --recompute-method.",
         "replace --checkpoint-activations with --recompute-activations (selective) or "
         "--recompute-granularity full --recompute-method uniform|block --recompute-num-layers N",
         "megatron/training/arguments.py:424-432 @ core_v0.16.1"),
)


@lru_cache(maxsize=1)
def card_signatures() -> tuple:
    """One matcher per card constraint whose `message` is upstream text."""
    from mbridge_recompute.facts import card

    out = []
    for c in card.constraints():
        kind = "config" if c.get("kind") in ("config", "training-args", "bridge") else "runtime"
        for message, keys in card.message_variants(c["id"]):   # the text can differ by release
            msg = (message or "").strip()
            if msg in _NOT_A_MESSAGE or len(msg) < 12:
                continue
            pattern, anchor = message_regex(msg)
            out.append(Signature(id=c["id"], kind=kind, pattern=pattern, anchor=anchor, fix=c.get("fix", ""),
                                 source=card.citations(c["id"], keys), cause=c.get("condition", ""),
                                 severity=c.get("severity", "error"), constraint_id=c["id"],
                                 prefix=_distinctive_prefix(msg), message=msg))
    return tuple(out)


def _distinctive_prefix(message: str) -> str:
    """The text before a message's first {part}, if long enough to name it on its own.

    People quote the head of a long message ("Invalid choices for recompute_modules: {''}")
    and drop its tail; the head alone still identifies the rule."""
    head = message.split("{", 1)[0]
    return head.strip() if "{" in message and len(head.strip()) >= 30 else ""


@lru_cache(maxsize=1)
def all_signatures() -> tuple:
    """Card matchers first (the card is the source of truth), then the runtime entries whose
    message the card does not (yet) carry -- so a string added to the card wins over this table."""
    cards = card_signatures()
    line_cards = tuple(s for s in cards if not (s.exc_type or s.frames))
    own = tuple(s for s in RUNTIME
                if not s.message or match_line(re.sub(r"\{[^{}]*\}|…", "", s.message), line_cards) is None)
    return cards + own


@dataclass(frozen=True)
class _Index:
    """What `match_line` / `match_exception` need of one signature tuple, built once.

    A log can hold millions of lines; testing each against a hundred signatures one by one in
    Python was most of diagnose's time on a large log. Each line signature gets a *keyword*: a
    whole word of its message that any matching line must contain as a word (bounded by
    non-word characters inside the message's fixed text). One `findall` of a line's words and
    one set test then reject almost every line; only the signatures whose keyword is there are
    tested in full. A signature without such a word is tested by its anchor on every line.
    """
    pairs: tuple                 # (anchor, signature) of the line signatures, in order
    keywords: dict               # word -> positions in `pairs`
    words: frozenset             # keywords' keys, for the quick reject
    unkeyed: tuple               # positions in `pairs` with no keyword
    head_keywords: dict          # word -> positions of signatures with a quoted head (`prefix`)
    head_words: frozenset
    unkeyed_heads: tuple
    exceptions: tuple            # the signatures matched against exceptions, in order


_WORD = re.compile(r"\w+")
_PART = re.compile(r"\{[^{}]*\}|…|\.\.\.$")


def _keyword(parts: list, first_open: bool = True, last_open: bool = True) -> Optional[str]:
    """The longest word of the fixed `parts` of a message that a match shows as a whole word.

    A word at the edge of a part next to a `{placeholder}` may be glued to the placeholder's
    text in a real line, so it does not count; the message's own start and end do count
    (`first_open` / `last_open`), since a message is printed after `Error: ` or a log prefix.
    """
    best = None
    for i, part in enumerate(parts):
        for m in _WORD.finditer(part):
            left_ok = m.start() > 0 or (i == 0 and first_open)
            right_ok = m.end() < len(part) or (i == len(parts) - 1 and last_open)
            word = m.group(0)
            if left_ok and right_ok and len(word) >= 4 and (best is None or len(word) > len(best)):
                best = word
    return best


def _message_keyword(s: Signature) -> Optional[str]:
    if not s.message:
        return None
    return _keyword(_PART.split(s.message.strip()))


def _build_index(sigs: tuple) -> _Index:
    pairs = tuple((s.anchor, s) for s in sigs if not (s.exc_type or s.frames))
    keywords: dict = {}
    unkeyed = []
    heads: dict = {}
    unkeyed_heads = []
    for i, (_, s) in enumerate(pairs):
        word = _message_keyword(s)
        if word is None:
            unkeyed.append(i)
        else:
            keywords.setdefault(word, []).append(i)
        if s.prefix:
            hw = _keyword([s.prefix], first_open=True, last_open=False)
            if hw is None:
                unkeyed_heads.append(i)
            else:
                heads.setdefault(hw, []).append(i)
    return _Index(pairs=pairs, keywords=keywords, words=frozenset(keywords), unkeyed=tuple(unkeyed),
                  head_keywords=heads, head_words=frozenset(heads), unkeyed_heads=tuple(unkeyed_heads),
                  exceptions=tuple(s for s in sigs if s.exc_type or s.frames))


_INDEX: dict = {}


def _index(sigs: tuple) -> _Index:
    hit = _INDEX.get(id(sigs))
    if hit is not None and hit[0] is sigs:
        return hit[1]
    idx = _build_index(sigs)
    _INDEX[id(sigs)] = (sigs, idx)
    return idx


def _literal_length(s: Signature) -> int:
    """How much fixed text a signature's message has: the more, the more specific."""
    return len(re.sub(r"\{[^{}]*\}", "", s.message or ""))


def _candidates(words: list, table: dict, keys: frozenset, unkeyed: tuple) -> list:
    if keys.isdisjoint(words):
        return list(unkeyed)
    found = set(unkeyed)
    for w in words:
        hit = table.get(w)
        if hit:
            found.update(hit)
    return sorted(found)


def match_line(line: str, sigs: tuple) -> Optional[Signature]:
    """The line signature whose message is in `line` (the most specific when several are:
    'X should be divisible by Y' also matches a longer message), or None."""
    return _match_line(line, _index(sigs))


def line_matcher(sigs: tuple):
    """`match_line` bound to `sigs`, for a loop over many lines."""
    idx = _index(sigs)
    return lambda line: _match_line(line, idx)


def _match_line(line: str, idx: _Index) -> Optional[Signature]:
    words = _WORD.findall(line)
    hits = []
    for i in _candidates(words, idx.keywords, idx.words, idx.unkeyed):
        anchor, s = idx.pairs[i]
        if anchor in line and s.regex.search(line):
            hits.append(s)
    if hits:
        return max(hits, key=_literal_length)    # max keeps the first of equals: `sigs` order
    # a quoted head without the message's tail: accept it only when one signature has that head
    heads = [idx.pairs[i][1] for i in _candidates(words, idx.head_keywords, idx.head_words, idx.unkeyed_heads)
             if idx.pairs[i][1].prefix in line]
    return heads[0] if len(heads) == 1 else None


def match_exception(exc_type: str, message: str, frames: list, sigs: tuple) -> Optional[Signature]:
    funcs = None
    short = exc_type.rsplit(".", 1)[-1]
    for s in _index(sigs).exceptions:
        if s.exc_type and s.exc_type != short:
            continue
        if s.frames:
            funcs = {f.func for f in frames} if funcs is None else funcs
            if not funcs & set(s.frames):
                continue
        if s.regex.search(message):
            return s
    return None
