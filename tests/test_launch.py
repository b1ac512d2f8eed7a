"""The seam from a decision to llama-server's command line (ggufdspark.launch): serve, bench and tune
run the same server; each slot gets a usable context; a prompt longer than its slot is refused
plainly by the real engine, which goes on serving."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from dataclasses import replace

from ggufdspark import hardware, launch
from ggufdspark.devices import Device, DeviceReport
from ggufdspark.engine.probe import DRAFT_PAUSE_HELP
from ggufdspark.errors import ContextSizeError, InvalidArgumentError
from ggufdspark.measuring import bench
from ggufdspark.measuring import measure as ms
from ggufdspark.serve import ServingOptions, plan, serving

# what differs between a bench arm and serve's server by design: where it listens and logs, the
# chat page, and the synthetic-acceptance flags only measurements add
_VALUED = {"--port", "--host", "--path", "--spec-synth-len", "--spec-synth-rates", "--api-key-file"}


def engine_args(argv: list[str]) -> list[str]:
    """``argv`` without the flags (and their values) a measurement and serve may differ in."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in _VALUED:
            skip = True
        else:
            out.append(a)
    return out


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


H200 = DeviceReport(devices=[Device("CUDA0", "NVIDIA H200", "gpu", 140 << 30, 141 << 30)], backend="cuda",
                    source="bindings")
# the token table on the GPU (launch.decide on CUDA with one device)
TABLE_ON_GPU = ["-ot", r"token_embd\.weight=CUDA0"]


def test_bench_drafted_arm_is_serves_server_on_cpu(ggufdspark_cli, small_pair, isolated, tmp_path):
    """A real bench run at 32 parallel requests and `serve --dry-run --json -np 32`: the same engine
    arguments (this machine's real decision, the real engine with its patches), drafted and plain."""
    t, d = str(small_pair.target), str(small_pair.draft)
    p = ggufdspark_cli("serve", "-m", t, "-md", d, "--dry-run", "--json", "-np", "32", "--no-ui")
    assert p.returncode == 0, p.stderr
    served = json.loads(p.stdout)
    b = ggufdspark_cli("bench", "-m", t, "-md", d, "--concurrency", "32", "--limit", "1", "--categories", "complex_reasoning",
                       "-n", "4", "--no-gate", "--json", "--log-dir", str(tmp_path / "logs"), timeout=900)
    assert b.returncode in (0, 5), b.stderr  # 5: the shared machine drifted; the commands still count
    st = json.loads(b.stdout)["settings"]
    assert engine_args(st["spec_command"]) == engine_args(served["argv"]), (st["spec_command"], served["argv"])
    assert "--no-repack" not in served["argv"]  # the engine has patch 0009: serve keeps repacking, so does bench
    assert (st["ctx_size"], st["ctx_per_slot"]) == (32 * 4096, 4096) == (served["context"]["total"],
                                                                       served["context"]["per_slot"])
    assert _value(served["argv"], "-c") == str(32 * launch.CTX_PER_SLOT) and _value(served["argv"], "-np") == "32"
    # the plain arm is serve's server without the draft
    p = ggufdspark_cli("serve", "-m", t, "-md", d, "--dry-run", "--json", "-np", "32", "--no-ui", "--no-draft")
    assert engine_args(st["plain_command"]) == engine_args(json.loads(p.stdout)["argv"])
    assert "-md" not in st["plain_command"] and "--spec-type" not in st["plain_command"]


def test_bench_drafted_arm_is_serves_server_for_a_cuda_decision(small_pair, isolated):
    """Deciding for an H200 with the real engine's patch list: bench's arms and serve's plan at -np 32
    carry the same flags, the table's load cut among them (drafts cut to 3 above 16 busy slots, the
    engine's 0021) and the drafter's n_ubatch (--spec-draft-ubatch 2048, its 0037); --draft-n-max drops
    the cut in both and keeps the n_ubatch."""
    for extra, cut in (({}, "16:3"), ({"draft_n_max": 4}, None)):
        opts = ServingOptions(model=small_pair.target, draft=small_pair.draft, **extra)
        p = plan(replace(opts, parallel=32, ui=False), devices=H200)
        info, _devices, decision, _limits = ms.prepare(opts, concurrency=[1, 8, 32], devices=H200)
        plain, spec = bench.bench_arms(info, decision, opts, parallel=32)
        argv = p.to_dict()["argv"]  # what serve --dry-run --json prints
        assert engine_args(spec.args()) == engine_args(argv), (spec.args(), argv)
        assert _value(argv, "--spec-draft-n-max-by-slots") == cut
        assert _value(argv, "--spec-draft-ubatch") == "2048"
        # the table's 7, cut to what the small pair's drafter makes a step (its block: 6)
        assert _value(argv, "--spec-draft-n-max") == str(extra.get("draft_n_max", launch.draft_block(small_pair.draft)[1]))
        assert {"-ngl", "-ngld", "-fa"} <= set(argv) and _value(argv, "-c") == str(32 * launch.CTX_PER_SLOT)
        alone = plan(replace(opts, parallel=32, ui=False, no_draft=True), devices=H200)
        assert engine_args(plain.args()) == engine_args(alone.settings.args())
        assert "-md" not in plain.args() and "-ngld" not in plain.args() and "-ngl" in plain.args()
        assert "--spec-draft-ubatch" not in plain.args()
        # the token table on the GPU in serve's line (what serve --dry-run prints) and both arms
        assert argv[-2:] == spec.args()[-2:] == plain.args()[-2:] == TABLE_ON_GPU, argv
        assert p.to_dict()["decision"]["token_table_device"] == "CUDA0"
        assert shlex.join(p.settings.redacted()).endswith(r"-ot 'token_embd\.weight=CUDA0'")
    # tune's drafted arms: each length as 'serve --draft-n-max N' runs it (no cut), the plain one serve's without draft
    base = ms.base_settings(info, opts, decision=decision, parallel=32)
    assert ms.arm_settings(base, small_pair.draft, n_max=7).draft_n_max_by_slots is None


def test_decision_is_final_and_engine_aware():
    """launch.decide: the table's cut only with the table's length and an engine with patch 0021; a
    given cut the engine cannot run is a warning, never a flag; a tune profile's limit turns drafting off."""
    from ggufdspark.engine import EngineInfo

    patched = EngineInfo(path="llama-server", source="explicit", dspark=True, draft_pause=True,
                         patches=["0021-server-spec-draft-n-max-by-slots.patch"])
    bare = EngineInfo(path="llama-server", source="explicit", dspark=True)
    assert launch.decide(H200, patched, parallel=32).draft_cut == [(16, 3)]
    assert launch.decide(H200, patched, parallel=32).draft_ubatch is None  # no patch 0037 in its list
    assert launch.decide(H200, patched, parallel=16).draft_cut is None  # never more than 16 generate
    assert launch.decide(H200, bare, parallel=32).draft_cut is None
    assert launch.decide(H200, patched, parallel=32, draft_cut="off").draft_cut is None
    d = launch.decide(H200, bare, parallel=32, draft_cut="2:5")
    assert d.draft_cut is None and "patch 0021" in d.warnings[0] and "warnings" not in d.to_dict()
    prof = {"path": "p.json", "recommendation": {"draft_enabled": True, "draft_n_max": 4,
                                                 "max_concurrency_for_draft": 8}}
    d = launch.decide(H200, patched, profile=prof, parallel=32)
    assert not d.draft_enabled and any("stops paying above 8" in r for r in d.reasons)
    d = launch.decide(H200, patched, profile=prof, parallel=8)
    assert d.draft_enabled and d.draft_n_max == 4 and d.draft_cut is None
    # bench and tune measure the draft where a profile turned it off, and say so
    off = {"path": "p.json", "recommendation": {"draft_enabled": False, "why": "slower here",
                                                "max_concurrency_for_draft": 0}}
    assert not launch.decide(H200, patched, profile=off, parallel=32).draft_enabled
    d = launch.decide(H200, patched, profile=off, parallel=32, measuring=True)
    assert d.draft_enabled and d.draft_n_max == 7 and d.draft_cut == [(16, 3)]
    assert [r for r in d.reasons if "measured with the draft all the same" in r] == [d.reasons[1]]
    with pytest.raises(InvalidArgumentError, match="'8:x' is not N:L"):
        launch.decide(H200, patched, draft_cut="8:x")


def test_a_pause_step_needs_an_engine_that_pauses(monkeypatch):
    """L = 0 (drafts paused above N busy slots, 0021 since 0026 joined the series): the table's
    pause step goes only to an engine whose help says it pauses; a given pause step with any other
    engine is dropped with a warning naming it, the other steps kept; parse_draft_cut takes 0."""
    from ggufdspark.engine import EngineInfo

    old = EngineInfo(path="old-server", source="explicit", dspark=True,
                     patches=["0021-server-spec-draft-n-max-by-slots.patch"])
    pausing = EngineInfo(path="llama-server", source="explicit", dspark=True, draft_pause=True,
                         patches=["0021-server-spec-draft-n-max-by-slots.patch"])
    assert launch.parse_draft_cut("2:5,16:0") == [(2, 5), (16, 0)]
    # the CUDA table cuts to 3 above 16 (no pause): every engine with 0021 takes it
    for engine in (pausing, old):
        d = launch.decide(H200, engine, parallel=64)
        assert d.draft_cut == [(16, 3)] and not [w for w in d.warnings if "pause" in w], d.warnings
        assert any("to 3 above 16 busy slots" in r for r in d.reasons), d.reasons
    # a table whose step pauses (as CUDA's did before 0036 and 0037): only the pausing engine gets it
    monkeypatch.setitem(hardware.DEFAULTS, "cuda", replace(hardware.DEFAULTS["cuda"], draft_cut=((16, 0),)))
    d = launch.decide(H200, pausing, parallel=64)
    assert d.draft_cut == [(16, 0)] and not [w for w in d.warnings if "pause" in w], d.warnings
    assert any("paused above 16 busy slots" in r for r in d.reasons), d.reasons
    d = launch.decide(H200, old, parallel=64)
    assert d.draft_cut is None, d  # the table's one step is a pause
    assert any("old-server cannot pause" in w and "drafts go on at every load" in w for w in d.warnings), d.warnings
    assert not [w for w in launch.decide(H200, old, parallel=16).warnings if "pause" in w]  # never above 16 here
    d = launch.decide(H200, old, parallel=64, draft_cut="4:3,16:0")
    assert d.draft_cut == [(4, 3)] and any("old-server cannot pause drafting" in w for w in d.warnings), d.warnings
    d = launch.decide(H200, old, parallel=64, draft_cut="16:0")
    assert d.draft_cut is None and any("cannot pause" in w for w in d.warnings), d.warnings
    assert launch.decide(H200, pausing, parallel=64, draft_cut="0:0").draft_cut == [(0, 0)]
    for bad in ("2:-1", "2:65"):
        with pytest.raises(InvalidArgumentError, match="is not N:L"):
            launch.parse_draft_cut(bad)


def test_the_engine_says_it_pauses(dspark_engine):
    """The engine built here (0021 with L = 0) says so in --help, which EngineInfo reads."""
    assert dspark_engine.draft_pause, f"{dspark_engine.path}: --help does not say '{DRAFT_PAUSE_HELP}'"


def test_cuda_graphs_above_16_slots_are_said():
    """Above 16 slots on CUDA: an engine with patch 0025 turns CUDA graphs off itself (a reason),
    any other gets a warning naming the variable that does it; 16 slots, or the CPU, neither."""
    from ggufdspark.devices import DeviceReport
    from ggufdspark.engine import EngineInfo

    patched = EngineInfo(path="llama-server", source="explicit", dspark=True,
                         patches=["0025-server-CUDA-graphs-off-above-16-slots-where-replaying-them-died.patch"])
    bare = EngineInfo(path="/opt/llama-server", source="explicit", dspark=True)
    d = launch.decide(H200, patched, parallel=32)
    assert [r for r in d.reasons if "CUDA graphs off at 32 slots (above 16" in r] and not d.warnings, d
    d = launch.decide(H200, bare, parallel=17, no_draft=True)
    assert [w for w in d.warnings if "/opt/llama-server lacks engine patch 0025" in w
            and "GGML_CUDA_DISABLE_GRAPHS=1" in w], d.warnings
    for dev, engine, n in ((H200, bare, 16), (DeviceReport(backend="cpu", source="none"), bare, 64)):
        d = launch.decide(dev, engine, parallel=n)
        assert not [x for x in d.reasons + d.warnings if "CUDA graphs" in x], (n, d)



def test_the_token_table_goes_on_the_gpu_on_cuda_only():
    """On CUDA with one GPU the target's token table is loaded onto it (TABLE_ON_GPU,
    llama.cpp's buffer named as the device; CUDA0 where no device is listed), drafted or not, with
    the measured reason; Metal, the CPU and other GPUs keep it where llama.cpp puts it; two CUDA GPUs
    do too, the reason saying why (a tensor override turns pipeline parallelism off)."""
    for no_draft in (False, True):
        d = launch.decide(H200, None, no_draft=no_draft)
        assert d.token_table_device == "CUDA0" and d.to_dict()["token_table_device"] == "CUDA0", d
        said = [r for r in d.reasons if r"-ot token_embd\.weight=CUDA0" in r]
        assert len(said) == 1 and "2.35x" in said[0] and "speed-ot.json" in said[0], d.reasons
    assert launch.decide(DeviceReport(backend="cuda"), None).token_table_device == "CUDA0"
    assert launch.table_decision("cuda").token_table_device == "CUDA0"
    only1 = DeviceReport(devices=[Device("CUDA1", "NVIDIA H200", "gpu", 140 << 30, 141 << 30)], backend="cuda")
    assert launch.decide(only1, None).token_table_device == "CUDA1"
    for backend in ("metal", "cpu", "vulkan"):
        d = launch.decide(DeviceReport(backend=backend), None, parallel=4)
        assert d.token_table_device is None and not [r for r in d.reasons if "token table" in r], d
    two = DeviceReport(devices=[Device(f"CUDA{i}", "NVIDIA H200", "gpu", 140 << 30, 141 << 30) for i in (0, 1)],
                       backend="cuda", source="bindings")
    d = launch.decide(two, None)
    assert d.token_table_device is None and d.offload, d
    assert [r for r in d.reasons if r.startswith("2 GPUs: the token table stays on the CPU")
            and "pipeline parallelism" in r], d.reasons


def test_the_token_table_flag_follows_extra_args_and_yields_to_the_users():
    """The override comes after the user's engine arguments, stays on the plain arm (a hardware
    decision, not the draft's) and on other draft lengths; a user's own -ot / --override-tensor whose
    pattern finds token_embd.weight replaces it (the loader takes the first match), one that does not
    gets it joined to its value."""
    d = launch.decide(H200, None)
    s = launch.server_settings(d, None, model="t.gguf", draft="d.gguf", extra_args=["--seed", "7"])
    argv = s.args()
    assert argv[-4:] == ["--seed", "7", *TABLE_ON_GPU] and argv.count("-ot") == 1, argv
    plain = launch.without_draft(s).args()
    assert plain[-2:] == TABLE_ON_GPU and "-md" not in plain, plain
    assert launch.with_draft(s, "d.gguf", 3).args()[-2:] == TABLE_ON_GPU
    arm = ms.arm_settings(s, None).args()  # bench's and tune's plain arm
    assert arm[-2:] == TABLE_ON_GPU
    for user in (["-ot", r"token_embd\.weight=CPU"], ["--override-tensor", "token_embd.weight=CPU"],
                 ["--override_tensor", ".*=CPU"], ["-ot", "blk\\.0\\..*=CPU,token_embd=CPU"]):
        mine = launch.server_settings(d, None, model="t.gguf", extra_args=user)
        argv = mine.args()
        assert mine.token_table_device is None and argv[-2:] == user and "CUDA0" not in " ".join(argv), argv
        # a flag added later (a benchmark's variant, harness.with_args) is honoured too
        later = replace(s, extra_args=list(s.extra_args) + user).args()
        assert later[-2:] == user and "CUDA0" not in " ".join(later), later
    # one that does not: ours joins its value after its own patterns (one -ot flag: the engine warns
    # about a repeated one)
    other = ["-ot", r"blk\.0\.ffn_.*=CPU"]
    argv = launch.server_settings(d, None, model="t.gguf", extra_args=other).args()
    assert argv[-2:] == ["-ot", rf"{other[1]},{TABLE_ON_GPU[1]}"] and argv.count("-ot") == 1, argv


def test_the_token_table_flag_yields_to_the_engines_environment(monkeypatch):
    """The engine reads LLAMA_ARG_OVERRIDE_TENSOR before its command line and puts those overrides
    first (common/arg.cpp), so one there that places the token table wins over any -ot: serve then
    adds none and does not claim the table (from this process's environment, or a server's own
    ``env``); one that does not touch the table leaves serve's flag in place."""
    d = launch.decide(H200, None)
    monkeypatch.setenv("LLAMA_ARG_OVERRIDE_TENSOR", r"token_embd\.weight=CPU")
    s = launch.server_settings(d, None, model="t.gguf", draft="d.gguf")
    assert s.token_table_device is None and "-ot" not in s.args(), s.args()
    mine = replace(launch.server_settings(d, None, model="t.gguf"), token_table_device="CUDA0")
    assert "-ot" not in mine.args(), mine.args()  # claimed, yet the environment's override goes first
    monkeypatch.setenv("LLAMA_ARG_OVERRIDE_TENSOR", r"blk\.0\.ffn_.*=CPU")
    s = launch.server_settings(d, None, model="t.gguf", draft="d.gguf")
    assert s.token_table_device == "CUDA0" and s.args()[-2:] == TABLE_ON_GPU, s.args()
    assert "-ot" not in replace(s, env={"LLAMA_ARG_OVERRIDE_TENSOR": ".*=CPU"}).args()
    monkeypatch.delenv("LLAMA_ARG_OVERRIDE_TENSOR")
    assert launch.server_settings(d, None, model="t.gguf").args()[-2:] == TABLE_ON_GPU


def test_each_slot_gets_a_usable_context(ggufdspark_cli, small_pair, isolated):
    """serve -np 32: 4096 tokens a slot by default (stated in --json and on stderr); -c stays the
    user's whole context, warned about when a slot gets under 1024; --ctx-per-slot sets the share."""
    base = ("serve", "-m", str(small_pair.target), "-md", str(small_pair.draft), "--dry-run", "--json", "-np", "32")
    p = ggufdspark_cli(*base)
    assert p.returncode == 0, p.stderr
    ctx = json.loads(p.stdout)["context"]
    assert ctx["per_slot"] == 4096 and ctx["total"] == 131072 and ctx["parallel"] == 32, ctx
    assert "context: 4096 tokens a slot x 32 slot(s) (-c 131072)" in p.stderr
    p = ggufdspark_cli(*base, "-c", "4096")
    plan_ = json.loads(p.stdout)
    assert p.returncode == 0 and plan_["context"]["per_slot"] == 256 and "-c 4096" in plan_["command"]
    assert any("divided among the 32 slots (-np): 256 tokens a slot" in w for w in plan_["warnings"])
    assert "WARNING: -c 4096 is llama-server's whole context" in p.stderr
    p = ggufdspark_cli(*base, "--ctx-per-slot", "1000")
    ctx = json.loads(p.stdout)["context"]
    assert (ctx["total"], ctx["per_slot"]) == (32000, 1024), ctx  # the engine pads each slot to 256
    p = ggufdspark_cli(*base, "-c", "4096", "--", "-kvu")  # one KV cache shared: any slot may fill -c
    plan_ = json.loads(p.stdout)
    assert plan_["context"]["per_slot"] == 4096 and plan_["warnings"] == [], plan_["context"]
    p = ggufdspark_cli(*base, "-c", "4096", "--ctx-per-slot", "1000")
    assert p.returncode == 2 and "give one" in p.stderr and "Traceback" not in p.stderr


def test_a_model_trained_for_less_gets_its_own_context(small_pair, isolated, tmp_path):
    """A target trained for 2048 tokens: each slot gets 2048 (serve and bench alike)."""
    from ggufdspark.gguffile.constants import TensorType
    from ggufdspark.gguffile.reader import read_gguf
    from ggufdspark.gguffile.writer import GGUFWriter

    g = read_gguf(small_pair.target)
    key = f"{g.arch}.context_length"
    assert g.get_int("{arch}.context_length") > 4096, "the small pair should be trained for more than 4096"
    w = GGUFWriter(tmp_path / "short.gguf")
    for k, v in g.metadata.items():
        vt, it = g.value_types[k]
        w.add(k, 2048 if k == key else v, vt, it)
    for name, t in g.tensors.items():
        w.add_tensor(name, t.shape, TensorType(t.type))
    w.write(lambda name: [g.tensor_bytes(name).tobytes()])
    c = launch.context(4, model=tmp_path / "short.gguf")
    assert (c.total, c.per_slot, c.trained) == (8192, 2048, 2048) and "trained context" in c.why
    c = launch.context(4, model=tmp_path / "short.gguf", ctx_per_slot=8192)
    assert c.per_slot == 2048 and "more than the model was trained for (2048)" in c.warnings[0]


def test_a_prompt_longer_than_its_slot_is_refused_plainly(small_pair, isolated):
    """The real engine at 2 slots of 256 tokens: a 400-token prompt gets HTTP 400, raised as
    ContextSizeError naming both numbers; the server answers the next request."""
    with serving(small_pair.target, small_pair.draft, parallel=2, ctx_per_slot=256) as (srv, client):
        with pytest.raises(ContextSizeError) as e:
            client.complete([5] * 400, n_predict=4)
        assert (e.value.n_prompt, e.value.n_ctx) == (400, 256), str(e.value)
        assert "HTTP 400" in str(e.value) and "a slot of this server holds 256" in str(e.value)
        assert "--ctx-per-slot" in str(e.value)
        assert srv.alive() and client.health()
        assert client.complete([5] * 100, n_predict=4).timings.predicted_n == 4


def test_check_imports_without_the_generator():
    """check (and the families it names) reads the pair shapes from ggufdspark.shapes, not from the
    test-pair generator (ggufdspark.synthetic, which also needs the 'generate' extra)."""
    code = ("import sys; sys.modules['ggufdspark.synthetic'] = None; import ggufdspark.check, ggufdspark.families; "
            "import ggufdspark.cli.check; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


@pytest.mark.parametrize("total,parallel,extra", [(4096, 32, []), (4096, 32, ["-kvu"]), (3000, 3, []), (0, 2, []),
                                                  (4000, 4, ["-kvu", "--kv-unified-per-slot", "1000"])])
def test_slot_context_is_what_the_engine_gives_each_slot(small_pair, start_server, tmp_path, total, parallel, extra):
    """launch.slot_context (what --dry-run --json states, and what a benchmark's pooled arm gets)
    against the real engine's own log line."""
    import re

    srv = start_server(model=small_pair.target, spec_type=None, ctx_size=total, parallel=parallel, extra_args=extra)
    log = srv.log_path.read_text(errors="replace")
    m = re.search(r"n_ctx_slot = (\d+)", log)
    assert m, f"no n_ctx_slot line in {srv.log_path}"
    cap = int(extra[-1]) if launch.KV_SLOT_CAP_FLAG in extra else None
    want = launch.slot_context(total, parallel, launch.trained_context(small_pair.target), unified=bool(extra), cap=cap)
    assert int(m.group(1)) == want
    assert f"kv_unified = '{'true' if extra else 'false'}'" in log


def test_a_table_length_beyond_the_drafters_block_is_cut_to_it(small_pair, dspark_engine):
    """The CUDA table's draft length (7) on a drafter whose block makes fewer tokens a step: serve's
    plan and bench's decision both cut it to what the drafter makes, and say why (bench refused the
    pair before, while serve ran it with the engine clamping silently); a length given explicitly is
    not cut, a drafter that makes more is not touched."""
    block = launch.draft_block(small_pair.draft)
    assert block is not None and block[1] < 7, f"the small pair's drafter makes {block}: the case tests nothing"
    n = block[1]
    d = launch.decide(H200, dspark_engine, draft_max=n)
    assert d.draft_n_max == n and any(f"draft length {n} instead of 7" in r for r in d.reasons), d.reasons
    assert launch.decide(H200, dspark_engine, draft_max=n, draft_n_max=7).draft_n_max == 7
    assert launch.decide(H200, dspark_engine, draft_max=9).draft_n_max == 7
    p = plan(ServingOptions(model=small_pair.target, draft=small_pair.draft, server=dspark_engine.path,
                            use_profile=False), devices=H200)
    assert p.decision.draft_n_max == n and f"--spec-draft-n-max {n}" in " ".join(p.settings.args()), p.settings.args()
    _, _, decision, limits = ms.prepare(ServingOptions(model=small_pair.target, draft=small_pair.draft,
                                                       server=dspark_engine.path), concurrency=[1], devices=H200)
    assert decision.draft_n_max == limits.max_n == n, (decision.draft_n_max, limits)
