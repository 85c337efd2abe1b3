"""diagnose maps every recompute assertion and error string to its cause, fix and source line.

Messages are megatron-core's own text (0.16.1 as installed, main where noted), with
f-string parts filled in the way they print.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from conftest import ROOT, run_script

sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "logs"))

import logformat as lf  # noqa: E402

from mbridge_recompute.facts import card  # noqa: E402
from mbridge_recompute.logs import diagnose, runlog, signatures

MC = lf.MC


def one(text: str) -> dict:
    rep = diagnose.diagnose(runlog.parse_text(text + "\n"))
    errors = [f for f in rep["findings"] if f["kind"] in ("config", "runtime")]
    assert errors, rep
    return errors[0]


# (raised text as it appears in a log, expected finding id) -- §4.2/§4.3 and what the card adds
RAISED = [
    # runtime failures (forward time / module init), card-backed
    ("NameError: name 'FP8GlobalStateManager' is not defined", "label-needs-te"),
    ("ValueError: During training, performance may degrade if MoE and tensor parallelismare enabled without "
     "also enabling sequence parallelism.", "moe-tp-without-sp"),
    ("AssertionError: recompute_num_layers must be 1 for MTP recompute", "mtp-uniform-needs-one"),
    ("ValueError: moe_act recompute for fp8 or fp4 cannot work with the legacy GroupedMLP.",
     "fp8-moe-act-legacy-grouped-gemm"),
    ("AssertionError: CPU Offloading is enabled when TE is not present", "cpu-offloading-needs-te"),
    # runtime failures the card does not carry (signatures.RUNTIME)
    ("RuntimeError: Checkpointing is not compatible with .grad(), please use .backward() if possible",
     "checkpoint-with-autograd-grad"),
    ("ImportError: Transformer Engine is not installed. Please install it with `pip install "
     "transformer-engine`.", "te-checkpoint-needs-te"),
    ("ValueError: set_save_original_input is only needed on transformer-engine modules that save quantized "
     "tensors by default. It needs transformer-engine>=2.6.0dev0.", "save-original-input-needs-te-2-6"),
    ("NotImplementedError: set_for_recompute_input_layernorm is not implemented.",
     "layernorm-recompute-attention-override"),
    ("AssertionError: num_layers should be divisible by pipeline_model_parallel_size",
     "pp-does-not-divide-layers"),
    # megatron/training/arguments.py
    ("AssertionError: recompute method is not yet supported for selective recomputing granularity",
     "selective-with-method"),
    ("AssertionError: can distribute recomputed activations only across tensor model parallel groups",
     "distribute-needs-tp"),
    ("AssertionError: distributed recompute activations is only application to full recompute granularity",
     "distribute-needs-full"),
    ("AssertionError: for distributed recompute activations to work you need to use a recompute method ",
     "distribute-needs-method"),
    ("--checkpoint-activations is no longer valid, use --recompute-activations, or, for more control, "
     "--recompute-granularity and --recompute-method.", "checkpoint-activations-removed"),
    ("AssertionError: Fine-grained activation offloading is only supported with transformer_engine "
     "implementation", "fine-grained-offloading-needs-te-impl"),
    # __post_init__ (card)
    ("AssertionError: Invalid choices for recompute_modules: {'moe_layer'}. Allowed modules are: "
     "{'core_attn', 'moe_act', 'layernorm', 'mla_up_proj', 'mlp', 'moe', 'shared_experts'}",
     "modules-invalid-label"),
    ("ValueError: When using recompute_granularity: selective recompute_num_layers must be None.",
     "selective-with-num-layers"),
    ('ValueError: Using recompute_granularity: full so recompute_method must be "block" or "uniform"',
     "full-needs-method"),
    ("ValueError: Delayed scaling does not support moe_act and layernorm recompute for fp8.",
     "fp8-delayed-moe-act-layernorm"),
    ("ValueError: distribute_saved_activations: True must be false when sequence parallel is enabled: True",
     "distribute-saved-activations-with-sp"),
    ("ValueError: CPU offloading does not work when activation recomputation is enabled",
     "cpu-offloading-with-recompute"),
    # CUDA graphs
    ("AssertionError: full recompute is only supported with full iteration CUDA graph.",
     "full-recompute-needs-full-iteration-graph"),
    ("AssertionError: attention dropout is not supported with graphed attention recomputation.",
     "attention-dropout-with-graphed-core-attn"),
    ("AssertionError: moe recompute is not supported with moe_router CUDA graph with: ",
     "moe-recompute-with-te-moe-router-graph"),
    ("AssertionError: Invalid cuda graph implementation: te", "cuda-graph-impl-invalid"),
    ("AssertionError: disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm",
     "ep-overlap-with-moe-recompute"),
    ("AssertionError: disable full recomputation when enabling overlap_moe_expert_parallel_comm",
     "ep-overlap-with-full"),
    # Megatron-LM main only
    ("ValueError: 'mhc' and 'mlp' in recompute_modules cannot be used together. They use different "
     "checkpoint mechanisms that may conflict.", "mhc-with-mlp"),
    ("ValueError: 'mhc' in recompute_modules requires enable_mhc_connections=True.", "mhc-needs-connections"),
]


def _card_id_for(text: str):
    """The card constraint whose message is in `text`, if the card carries it (the card wins)."""
    hit = signatures.match_line(text, signatures.card_signatures())
    return hit.id if hit else None


@pytest.mark.parametrize("text,fid", RAISED, ids=[f for _, f in RAISED])
def test_recompute_error_string_maps_to_its_cause_fix_and_source(text, fid):
    f = one(text)
    assert f["id"] == (_card_id_for(text) or fid)
    assert f["severity"] == "error"
    assert f["next_action"].strip()
    assert re.search(r"\S+:\d+|@ ", f["source"]), f["source"]


def test_error_with_the_launcher_prefix_is_still_recognised():
    f = one("[default3]:[rank3]: ValueError: Delayed scaling does not support moe_act and layernorm "
            "recompute for fp8.")
    assert f["constraint_id"] == "fp8-delayed-moe-act-layernorm"


def test_uniform_index_error_is_recognised_from_its_frames():
    frames = [(f"{MC}/transformer/transformer_block.py", 530, "_checkpointed_forward", "checkpoint_handler("),
              (f"{MC}/transformer/transformer_block.py", 444, "_get_layer",
               "return self.layers[layer_number]"),
              ("/torch/nn/modules/container.py", 370, "__getitem__", "raise IndexError(...)")]
    f = one("\n".join(lf.traceback(frames, "IndexError: index 7 is out of range")))
    assert f["constraint_id"] == "uniform-num-layers-not-dividing-chunk"
    assert "recompute_method=block" in f["next_action"]


def test_index_error_elsewhere_is_not_the_uniform_recompute_bug():
    frames = [("/app/data.py", 10, "__getitem__", "return self.items[i]")]
    rep = diagnose.diagnose(runlog.parse_lines(lf.traceback(frames, "IndexError: index 7 is out of range")))
    assert [f["kind"] for f in rep["findings"]] == ["unknown"]
    assert not rep["explained"]


def test_full_recompute_fp8_without_te_is_recognised_from_its_frames():
    frames = [(f"{MC}/transformer/transformer_block.py", 508, "checkpoint_handler", "return te_checkpoint(")]
    f = one("\n".join(lf.traceback(frames, "TypeError: 'NoneType' object is not callable")))
    assert f["id"] == "full-recompute-fp8-without-te"


def test_te_version_typeerror_of_0_16_1_without_te_is_recognised():
    f = one("TypeError: '>=' not supported between instances of 'NoneType' and 'Version'")
    assert f["id"] == "te-version-none" and "Transformer Engine" in f["next_action"]


def _filled(message: str) -> str:
    return re.sub(r"\{[^{}]*\}", "X", message.replace("…", "")).strip()


# one entry per constraint and message text (a message can change between releases)
CARD_MESSAGES = [dict(c, message=message, releases=keys) for c in card.constraints()
                 for message, keys in card.message_variants(c["id"])
                 if (message or "").strip() not in signatures._NOT_A_MESSAGE
                 and len(message.strip()) >= 12]


def test_the_card_has_messages_to_match():
    assert len(CARD_MESSAGES) >= 40


@pytest.mark.parametrize("c", CARD_MESSAGES, ids=[f"{c['id']}@{c['releases'][0]}" for c in CARD_MESSAGES])
def test_every_card_message_is_recognised_by_its_constraint_id(c):
    rep = diagnose.diagnose(runlog.parse_text(f"AssertionError: {_filled(c['message'])}\n"))
    f = next(f for f in rep["findings"] if f["kind"] in ("config", "runtime"))
    assert f["constraint_id"] == c["id"]
    # the card's fix first (diagnose may add what the log shows, e.g. drop -rl)
    assert f["next_action"].startswith(c["fix"]) and f["source"] == card.citations(c["id"], c["releases"])


def test_runtime_table_does_not_repeat_a_card_message():
    # facts live once: no runtime entry matches a message the card already carries
    line_sigs = tuple(s for s in signatures.RUNTIME if not (s.exc_type or s.frames))
    for c in CARD_MESSAGES:
        hit = signatures.match_line(_filled(c["message"]), line_sigs)
        assert hit is None, (f"signatures.RUNTIME entry {hit.id!r} repeats card constraint {c['id']!r}: "
                             "delete the entry (diagnose already answers with the card's)")


def test_a_message_the_card_carries_is_matched_through_the_card(monkeypatch):
    """When the card gains a string this table also has, the card's entry answers and the table's
    drops out."""
    grad = next(s for s in signatures.RUNTIME if s.id == "checkpoint-with-autograd-grad")
    fake = {"id": "grad-in-card", "kind": "runtime", "severity": "error", "condition": "c", "fix": "card fix",
            "at": {"0.16": "rnd:539"}, "message": grad.message}
    monkeypatch.setattr(card, "constraints", lambda: [fake])
    monkeypatch.setattr(card, "message_variants", lambda cid: [(grad.message, ["0.16"])])
    monkeypatch.setattr(card, "citations", lambda cid, keys: "rnd:539 @ core_v0.16.1")
    signatures.card_signatures.cache_clear()
    signatures.all_signatures.cache_clear()
    try:
        ids = [s.id for s in signatures.all_signatures()]
        assert "grad-in-card" in ids and "checkpoint-with-autograd-grad" not in ids
        assert one("RuntimeError: " + grad.message)["constraint_id"] == "grad-in-card"
    finally:
        signatures.card_signatures.cache_clear()
        signatures.all_signatures.cache_clear()


def test_runtime_table_entries_cite_their_source():
    for s in signatures.RUNTIME:
        assert "@" in s.source and s.fix, s.id
        if s.constraint_id:
            card.constraint(s.constraint_id)          # names a real card constraint


def test_warning_alone_is_reported_but_explains_nothing():
    text = ("UserWarning: If you are using transformer_engine as the transformer implementation, the "
            "core_attn is from transformer_engine and may be the fused version. For fused attention, you "
            "have no need to set 'core_attn' to recompute. Please check that the core_attn recompute is "
            "really needed.")
    proc = run_script("diagnose", "--message", "/x/transformer_config.py:1224: " + text, "--json")
    assert proc.returncode == 1
    f = json.loads(proc.stdout)["findings"][0]
    assert (f["constraint_id"], f["severity"]) == ("core-attn-fused-attention", "warning")


def test_unlisted_config_assertion_is_still_a_config_finding():
    frames = [(f"{MC}/transformer/transformer_config.py", 1234, "__post_init__", "assert self.foo")]
    rep = diagnose.diagnose(runlog.parse_lines(lf.traceback(frames, "AssertionError: some brand-new rule")))
    f = rep["findings"][0]
    assert f["kind"] == "config" and f["source"].endswith("transformer_config.py:1234")
    assert rep["explained"]


def test_same_error_on_every_rank_is_one_finding():
    line = "AssertionError: full recompute is only supported with full iteration CUDA graph."
    rep = diagnose.diagnose(runlog.parse_lines([f"[default{r}]:{line}" for r in range(8)]))
    assert len(rep["findings"]) == 1 and rep["findings"][0]["count"] == 8


def test_cli_classifies_a_pasted_assertion_with_exit_0():
    proc = run_script("diagnose", "--message",
                      "AssertionError: disable moe in recompute_modules when enabling "
                      "overlap_moe_expert_parallel_comm", "--json")
    assert proc.returncode == 0, proc.stderr
    f = json.loads(proc.stdout)["findings"][0]
    assert f["kind"] == "config" and f["constraint_id"] == "ep-overlap-with-moe-recompute"


def test_oom_findings_come_before_error_findings():
    lines = [lf.iteration_line(1, 20, 3000.0)]
    msg = lf.oom_message(2 * lf.GIB, 79 * lf.GIB, lf.GIB, 76 * lf.GIB, 0.1 * lf.GIB)
    lines += lf.traceback(lf.BACKWARD, msg)
    lines += ["NameError: name 'FP8GlobalStateManager' is not defined"]
    rep = diagnose.diagnose(runlog.parse_lines(lines))
    assert [f["kind"] for f in rep["findings"]] == ["activations", "runtime"]


def test_the_quoted_head_of_a_long_message_is_recognised(run_tool):
    """SKILL.md and people quote "Invalid choices for recompute_modules: {''}" without the
    ". Allowed modules are: ..." tail; the head alone names the rule."""
    for text in ("Invalid choices for recompute_modules: {''}",
                 "AssertionError: Invalid choices for recompute_modules: {' layernorm'}"):
        p = run_tool("diagnose", "--message", text, "--json")
        assert p.returncode == 0, p.stdout
        ids = [f.get("constraint_id") for f in json.loads(p.stdout)["findings"]]
        assert "modules-invalid-label" in ids


def test_a_head_shared_by_two_messages_decides_nothing():
    """A head alone is accepted only when exactly one signature starts with it."""
    from mbridge_recompute.logs.signatures import Signature, match_line

    head = "When using recompute_granularity with a long shared head:"
    a = Signature(id="a", kind="config", pattern=re.escape(head) + r" .*? first", fix="", source="",
                  anchor="granularity", prefix=head)
    b = Signature(id="b", kind="config", pattern=re.escape(head) + r" .*? second", fix="", source="",
                  anchor="granularity", prefix=head)
    assert match_line(head + " {x}", (a,)) is a
    assert match_line(head + " {x}", (a, b)) is None
    assert match_line(head + " y second", (a, b)) is b


# ---------------------------------------------------------------- the harness command line

@pytest.mark.parametrize("message,sig_id", [
    # a space-separated second label, where a parser takes its arguments in full
    ("run_script.py: error: unrecognized arguments: moe_act", "argparse-unrecognized-arguments"),
    ("run_script.py: error: argument --task: invalid choice: 'peft' (choose from 'pretrain', 'sft', 'lora')",
     "argparse-invalid-choice"),
    ("bootstrap.py: error: argument --recompute_modules: expected one argument",
     "argparse-expected-one-argument"),
    # what Bridge's harness really does with a second label: Hydra gets it (parse_known_args)
    ("omegaconf.errors.OverridesError: Failed to parse Hydra overrides: Error parsing override 'layernorm'",
     "hydra-override-parse-error"),
])
def test_the_harness_command_line_errors_are_recognised(message, sig_id):
    rep = diagnose.diagnose(runlog.parse_text(message + "\n"))
    assert [f.get("id") for f in rep["findings"]] == [sig_id] and rep["explained"]


def test_a_bare_word_hydra_could_not_parse_points_at_the_space_separated_labels():
    log = ("megatron.bridge.training.utils.omegaconf_utils.OverridesError: Failed to parse Hydra overrides: "
           "Error parsing override 'b'\nmissing EQUAL at '<EOF>'\n")
    f = diagnose.diagnose(runlog.parse_text(log))["findings"][0]
    assert "missing EQUAL" in f["evidence"] and "comma" in f["next_action"]


def test_rl_beside_recompute_modules_is_fixed_by_dropping_rl_not_by_hydra_nulls():
    """argparse is applied after Hydra at every release (run_script.py:76-79 @ 067f987, :86-87 @ v0.5.1)."""
    log = ("torchrun --nproc_per_node 8 scripts/performance/bootstrap.py -m llama -rl 4 "
           "--recompute_modules mlp model.recompute_method=null\n"
           "ValueError: When using recompute_granularity: selective recompute_num_layers must be None.\n")
    f = diagnose.diagnose(runlog.parse_text(log))["findings"][0]
    assert f["next_action"].startswith("drop -rl") and "cannot undo -rl" in f["next_action"]
    # a pasted message alone: the card's fix (a recipe's leftover), and what to do when -rl was given
    f = diagnose.diagnose(runlog.parse_text(log.splitlines()[1] + "\n"))["findings"][0]
    assert f["next_action"].startswith("set recompute_num_layers=null") and "drop -rl" in f["next_action"]


def test_a_list_flag_given_twice_is_a_warning_naming_what_argparse_drops():
    log = "python bootstrap.py -m x --recompute_modules core_attn --recompute_modules moe_act\n"
    rep = diagnose.diagnose(runlog.parse_text(log))
    f = rep["findings"][0]
    assert f["id"] == "list-flag-given-twice" and f["severity"] == "warning" and not rep["explained"]
    assert "keeps only the last" in f["next_action"]


def test_the_run_dirs_manifest_argv_is_read_too(tmp_path):
    run = tmp_path / "core_attn"
    run.mkdir()
    (run / "log.txt").write_text("ValueError: When using recompute_granularity: selective "
                                 "recompute_num_layers must be None.\n")
    (run / "manifest.json").write_text(json.dumps({"name": "core_attn", "argv": [
        "torchrun", "scripts/performance/bootstrap.py", "-rl", "2", "--recompute_modules", "core_attn"]}))
    proc = run_script("diagnose", run, "--json")
    f = json.loads(proc.stdout)["findings"][0]
    assert proc.returncode == 0 and f["next_action"].startswith("drop -rl")
    text = run_script("diagnose", run).stdout
    assert "[selective-with-num-layers]" in text and "drop -rl" in text
