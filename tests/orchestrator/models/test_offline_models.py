"""``pipeline models list/pull/verify`` against a stand-in hub on 127.0.0.1 (huggingface_hub's real client)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from huggingface_hub import constants
from huggingface_hub.utils import filter_repo_objects

from orchestrator import Orchestrator
from orchestrator.models.cache import model_rows
from orchestrator.settings import Settings
from tests.conftest import MEDIA, ROOT, pipeline
from tests.orchestrator.models.standin_hub import Repo, StandinHub

EMBED = "standin/tiny-embed"
GATED = "standin/gated-diarizer"
BIG = "standin/big-embed"
ECAPA = "standin/ecapa"
#: huggingface_hub writes a download in pieces of this size: a cut-off pull keeps the whole pieces it read
PIECE = constants.DOWNLOAD_CHUNK_SIZE
#: weights of more than one piece (random, so no layer of the transfer can compress them)
BIG_WEIGHTS = os.urandom(PIECE + 300_000)
#: no stage of these settings but embeddings asks for a hub model
ONLY_EMBEDDINGS = ("--diarization-model", "embedded", "--asr-model", "embedded")


def repos() -> dict[str, Repo]:
    return {
        EMBED: Repo(
            files={
                "config.json": b'{"hidden_size": 8}',
                "modules.json": b"[]",
                "model.safetensors": bytes(range(256)) * 40,
                "onnx/model.onnx": b"another format, not loaded by the stage",
            },
            lfs={"model.safetensors", "onnx/model.onnx"},
        ),
        GATED: Repo(files={"config.yaml": b"pipeline: {}"}, gated=True, license="cc-by-4.0"),
        BIG: Repo(files={"config.json": b"{}", "model.safetensors": BIG_WEIGHTS}, lfs={"model.safetensors"}),
        ECAPA: Repo(
            files={
                "hyperparams.yaml": b"pretrainer:\n  paths:\n    embedding_model: "
                b"!ref <pretrained_path>/embedding_model.ckpt\n",
                "embedding_model.ckpt": b"ecapa weights" * 100,
            },
            lfs={"embedding_model.ckpt"},
        ),
    }


def cli(hub: StandinHub, home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The `pipeline` command (bin/pipeline runs this module), with HF_HOME and HF_ENDPOINT set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return pipeline(
        *args,
        env={
            **clean,
            "PYTHONPATH": str(ROOT),
            "HF_HOME": str(home),
            "HF_ENDPOINT": hub.endpoint,
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            **env,
        },
    )


@pytest.fixture
def hub():
    with StandinHub(repos()) as served:
        yield served


def lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def hub_rows(stdout: str) -> list[dict]:
    """The rows of `models list --json` that name a hub model (not the embedded ones)."""
    return [row for row in json.loads(stdout) if row["cached"] not in ("embedded", "local")]


def test_pull_fills_an_empty_cache_and_an_offline_run_plans_the_model(hub, tmp_path):
    # Given an empty HF_HOME and a hub that serves the embeddings profile's model
    home = tmp_path / "hf"
    sha = repos()[EMBED].sha
    # When `models pull` fetches what the settings need
    pulled = cli(hub, home, "models", "pull", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS)
    # Then one line names the model and its revision, and the cache holds its files but not other formats
    assert pulled.returncode == 0, pulled.stderr
    assert lines(pulled.stderr) == [f"pulled embeddings: {EMBED}@{sha} (3 files, 0.0 MiB)"], pulled.stderr
    snapshot = home / "hub" / "models--standin--tiny-embed" / "snapshots" / sha
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors", "modules.json"]
    # And offline, `models list` says it is cached and runs ...
    offline = {"HF_HUB_OFFLINE": "1"}
    listed = cli(
        hub, home, "models", "list", "--json", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS, **offline
    )
    assert listed.returncode == 0, listed.stderr
    rows = hub_rows(listed.stdout)
    assert rows == [
        {
            "stage": "embeddings",
            "repo": EMBED,
            "revision": "main",
            "cached": sha,
            "runs": f"{EMBED}@{sha}",
            "fallback_reason": None,
            "terms": None,
        }
    ]
    # ... and `process --allow-hub` plans that model, not the embedded fallback
    hub.requests.clear()
    planned = cli(
        hub,
        home,
        "process",
        "--dry-run",
        "--allow-hub",
        "--embedding-profile",
        EMBED,
        "-o",
        str(tmp_path / "out"),
        str(MEDIA / "speech.wav"),
        **offline,
        DIARIZATION_MODEL="embedded",
        ASR_MODEL="embedded",
    )
    assert planned.returncode == 0, planned.stderr
    assert f"embeddings [{EMBED}@{sha}]" in planned.stdout, planned.stdout
    assert not [r for r in hub.requests if "/resolve/" in r[1] or r[1].startswith("/api/")], hub.requests
    # And verify finds every file sound
    verified = cli(hub, home, "models", "verify", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS)
    assert verified.returncode == 0, verified.stderr
    assert lines(verified.stderr) == [f"ok {EMBED}@{sha} (3 files)"]


def test_list_without_the_model_names_the_fallback_and_why(hub, tmp_path):
    # Given an empty cache and no hub: the embedded fallback runs, and the row says why
    listed = cli(
        hub,
        tmp_path / "hf",
        "models",
        "list",
        "--json",
        "--offline",
        "--embedding-profile",
        EMBED,
        *ONLY_EMBEDDINGS,
    )
    assert listed.returncode == 0, listed.stderr
    (row,) = hub_rows(listed.stdout)
    assert row["cached"] is None and row["runs"] == "all-MiniLM-L6-v2 (embedded)"
    assert "hub is off" in row["fallback_reason"]


def test_a_gated_model_gives_a_one_line_hint(hub, tmp_path):
    # Given a gated pyannote pipeline whose files answer 401 without a token
    args = (
        "models",
        "pull",
        "--diarization-model",
        GATED,
        "--embedding-profile",
        "embedded",
        "--asr-model",
        "embedded",
    )
    # When it is pulled without HF_TOKEN, or with a token the hub refuses
    for env, extra in (({}, ""), ({"HF_TOKEN": "hf_wrong"}, " (the token given was refused)")):
        pulled = cli(hub, tmp_path / "hf", *args, **env)
        # Then exit 1 and one line: accept the conditions, set HF_TOKEN
        assert pulled.returncode == 1, pulled.stderr
        (line,) = lines(pulled.stderr)
        assert line.startswith(f"FAILED diarization: {GATED}: gated (HTTP 401): accept its conditions"), line
        assert line.endswith(f"set HF_TOKEN to a token of it{extra}"), line
    # And `models list` says why the embedded diarizer runs, and names the gate
    listed = cli(hub, tmp_path / "hf", "models", "list", "--json", "--allow-hub", *args[2:])
    (row,) = hub_rows(listed.stdout)
    assert row["runs"] == "embedded (segmentation-3.0 + CAM++)", row
    assert row["fallback_reason"].startswith("not cached, and gated: accept its conditions"), row
    assert row["terms"] == "cc-by-4.0, gated: accept its conditions on hf.co, then HF_TOKEN", row
    # And with the right token it is fetched, and listed as what runs
    pulled = cli(hub, tmp_path / "hf", *args, HF_TOKEN=hub.token)
    assert pulled.returncode == 0, pulled.stderr
    listed = cli(hub, tmp_path / "hf", "models", "list", "--json", *args[2:], HF_HUB_OFFLINE="1")
    (row,) = hub_rows(listed.stdout)
    assert row["runs"] == f"{GATED}@{repos()[GATED].sha}" and row["fallback_reason"] is None, row


def test_an_unreachable_hub_is_one_line(tmp_path):
    # Given a hub endpoint where nothing listens
    with StandinHub({}) as gone:
        pass
    pulled = cli(gone, tmp_path / "hf", "models", "pull", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS)
    assert pulled.returncode == 1, pulled.stderr
    (line,) = lines(pulled.stderr)
    assert line.startswith(f"FAILED embeddings: {EMBED}: not fetched (") and "is the hub reachable" in line
    # And with HF_HUB_OFFLINE set (the offline machine's environment), the line says to unset it
    pulled = cli(
        gone,
        tmp_path / "hf",
        "models",
        "pull",
        "--embedding-profile",
        EMBED,
        *ONLY_EMBEDDINGS,
        HF_HUB_OFFLINE="1",
    )
    assert pulled.returncode == 1
    assert lines(pulled.stderr) == [f"FAILED embeddings: {EMBED}: HF_HUB_OFFLINE is set: unset it to pull"]


def test_an_interrupted_pull_resumes_where_it_stopped(hub, tmp_path):
    # Given a pull cut off mid-file (every download of the weights stops 100 kB into its second piece)
    home = tmp_path / "hf"
    hub.drop_at["model.safetensors"] = PIECE + 100_000
    args = ("models", "pull", "--embedding-profile", BIG, *ONLY_EMBEDDINGS)
    first = cli(hub, home, *args)
    assert first.returncode == 1, first.stderr
    assert lines(first.stderr)[-1].startswith(f"FAILED embeddings: {BIG}: not fetched"), first.stderr
    (partial,) = (home / "hub" / "models--standin--big-embed" / "blobs").glob("*.incomplete")
    assert partial.stat().st_size == PIECE, first.stderr
    # When the connection holds and the pull is run again
    hub.drop_at.clear()
    hub.requests.clear()
    second = cli(hub, home, *args)
    # Then it asks only for the rest of the file, and the cache is sound
    assert second.returncode == 0, second.stderr
    gets = [r for r in hub.requests if r[0] == "GET" and r[1].endswith("/model.safetensors")]
    assert [r[2] for r in gets] == [f"bytes={PIECE}-"], gets
    verified = cli(hub, home, "models", "verify", "--embedding-profile", BIG, *ONLY_EMBEDDINGS)
    assert verified.returncode == 0, verified.stderr


def test_verify_finds_a_corrupt_and_a_missing_blob(hub, tmp_path):
    # Given a pulled model
    home = tmp_path / "hf"
    assert cli(hub, home, "models", "pull", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS).returncode == 0
    snapshot = home / "hub" / "models--standin--tiny-embed" / "snapshots" / repos()[EMBED].sha
    # When one blob's bytes change (same size) and another's blob is gone
    weights = (snapshot / "model.safetensors").resolve()
    weights.write_bytes(b"\0" * weights.stat().st_size)
    (snapshot / "modules.json").resolve().unlink()
    verified = cli(hub, home, "models", "verify", "--all")
    # Then exit 1, one line each
    assert verified.returncode == 1, verified.stderr
    bad = sorted(lines(verified.stderr))
    assert len(bad) == 2, bad
    assert bad[0].startswith(f"BAD {EMBED}: model.safetensors: corrupt (hash "), bad
    assert bad[1] == f"BAD {EMBED}: modules.json: missing (its blob is gone)", bad


@pytest.mark.parametrize(
    "fields",
    [
        {"embedding_profile": EMBED, "diarization_model": "auto", "asr_model": "small"},
        {"embedding_profile": "quality", "diarization_model": GATED, "asr_model": "embedded"},
        {"embedding_profile": "embedded", "diarization_model": "embedded", "asr_model": "large-v3"},
    ],
)
def test_list_says_what_process_plans(tmp_path, monkeypatch, fields):
    # Given a cache holding some of the settings' models (the embeddings model, the small Whisper), whole
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    whole = {
        EMBED: ("config.json", "modules.json", "model.safetensors"),
        "Systran/faster-whisper-small": ("config.json", "model.bin", "tokenizer.json", "vocabulary.json"),
    }
    for (repo, files), revision in zip(whole.items(), ("e" * 40, "5" * 40), strict=True):
        folder = tmp_path / "hf" / f"models--{repo.replace('/', '--')}"
        (folder / "snapshots" / revision).mkdir(parents=True)
        for name in files:
            (folder / "snapshots" / revision / name).write_text("{}")
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(revision)
    settings = Settings(allow_hub=False, device="cpu", output_dir=tmp_path / "out", **fields)
    # When `models list` and the orchestrator's plan resolve them
    rows = model_rows(settings)
    with Orchestrator(settings) as orch:
        planned = {spec.name: spec.model for spec in orch.stage_specs()}
    # Then every row of a planned stage "runs" its planned model, and a hub row runs its model exactly when
    # cached (`pipeline enroll`'s encoder is listed too, with no stage of `process`)
    assert rows, fields
    assert any(row.stage.endswith("voice_profile") for row in rows)
    for row in rows:
        stage = row.stage.split(", ", 1)[0]
        if stage in planned:
            assert row.runs == planned[stage], (row, planned)
        assert (row.fallback_reason is None) == (row.cached is not None), row
        if row.hub and row.cached:
            assert row.runs == f"{row.repo}@{row.cached}"


def test_an_asr_pull_takes_the_files_either_runtime_loads(tmp_path, monkeypatch):
    # Given a CTranslate2 Whisper (faster-whisper's name) and a transformers one (a hub id)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    files = {
        "Systran/faster-whisper-small": ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"],
        "openai/whisper-small": [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "generation_config.json",
        ],
    }
    for repo, wanted in files.items():
        (row,) = [
            row
            for row in model_rows(
                Settings(
                    allow_hub=False,
                    asr_model=repo,
                    embedding_profile="embedded",
                    diarization_model="embedded",
                )
            )
            if row.stage == "asr"
        ]
        # Then the files each runtime loads are fetched, other formats are not
        assert row.repo == repo
        fetched = filter_repo_objects(
            [*wanted, "flax_model.msgpack", "README.md"], allow_patterns=row.allow_patterns
        )
        assert sorted(fetched) == sorted(wanted)


def test_a_pull_cut_off_between_files_is_bad_and_not_cached(hub, tmp_path):
    # Given a pulled model whose weights never arrived (the pull stopped after the small files)
    home = tmp_path / "hf"
    assert cli(hub, home, "models", "pull", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS).returncode == 0
    sha = repos()[EMBED].sha
    (home / "hub" / "models--standin--tiny-embed" / "snapshots" / sha / "model.safetensors").unlink()
    # When the cache is verified
    verified = cli(hub, home, "models", "verify", "--all")
    # Then the missing weights are named and the exit is 1
    assert verified.returncode == 1, verified.stderr
    assert lines(verified.stderr) == [
        f"BAD {EMBED}: model.safetensors (or pytorch_model.bin): missing (the stage loads it: "
        "a pull cut off between files?)"
    ], verified.stderr
    # And `models list` does not claim the model runs: not cached, the missing file named
    offline = {"HF_HUB_OFFLINE": "1"}
    listed = cli(
        hub, home, "models", "list", "--json", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS, **offline
    )
    (row,) = hub_rows(listed.stdout)
    assert row["cached"] is None and row["runs"] == "all-MiniLM-L6-v2 (embedded)", row
    assert "lacks model.safetensors (or pytorch_model.bin)" in row["fallback_reason"], row
    # And `process` plans the fallback that will run (a rerun finds its vectors current)
    planned = cli(
        hub,
        home,
        "process",
        "--dry-run",
        "--offline",
        "--embedding-profile",
        EMBED,
        "-o",
        str(tmp_path / "out"),
        str(MEDIA / "speech.wav"),
        **offline,
        DIARIZATION_MODEL="embedded",
        ASR_MODEL="embedded",
    )
    assert planned.returncode == 0, planned.stderr
    assert "embeddings [all-MiniLM-L6-v2 (embedded)]" in planned.stdout, planned.stdout


def test_a_dereferenced_copy_is_hashed_against_the_blobs_or_said_unhashed(hub, tmp_path):
    # Given a pulled cache copied with its links dereferenced (cp -rL, rsync -L)
    home = tmp_path / "hf"
    assert cli(hub, home, "models", "pull", "--embedding-profile", EMBED, *ONLY_EMBEDDINGS).returncode == 0
    copy = tmp_path / "copy"
    shutil.copytree(home, copy, symlinks=False)
    snapshot = copy / "hub" / "models--standin--tiny-embed" / "snapshots" / repos()[EMBED].sha
    assert not (snapshot / "model.safetensors").is_symlink()
    # Then each file is found among the blobs by its hash
    verified = cli(hub, copy, "models", "verify", "--all")
    assert verified.returncode == 0, verified.stderr
    assert lines(verified.stderr) == [f"ok {EMBED}@{repos()[EMBED].sha} (3 files)"]
    # When the copied weights rot (same size, other bytes)
    weights = snapshot / "model.safetensors"
    weights.write_bytes(b"\1" * weights.stat().st_size)
    verified = cli(hub, copy, "models", "verify", "--all")
    # Then they are corrupt
    assert verified.returncode == 1, verified.stderr
    (line,) = lines(verified.stderr)
    assert line.startswith(f"BAD {EMBED}: model.safetensors: corrupt (a copy without its link"), line
    # And a copy of the snapshots alone (no blobs to compare with) is never "ok": its files are unhashed
    shutil.rmtree(snapshot.parents[1] / "blobs")
    verified = cli(hub, copy, "models", "verify", "--all")
    assert verified.returncode == 1, verified.stderr
    unhashed = lines(verified.stderr)
    assert len(unhashed) == 3 and all(line.startswith(f"UNHASHED {EMBED}: ") for line in unhashed), unhashed
    assert "could not be hashed" in unhashed[0] and not any(line.startswith("ok") for line in unhashed)


def test_verify_all_of_an_empty_cache_says_so(hub, tmp_path):
    verified = cli(hub, tmp_path / "hf", "models", "verify", "--all")
    assert verified.returncode == 1, verified.stderr
    (line,) = lines(verified.stderr)
    assert line.startswith("nothing cached: no model in "), line


def test_list_and_pull_take_every_model_the_settings_can_load(hub, tmp_path):
    # Given the ECAPA encoder (no voice profiles: `process` would not enroll; `pipeline enroll` would)
    home = tmp_path / "hf"
    ecapa = ("--speaker-encoder", "ecapa", *ONLY_EMBEDDINGS[:2], "--embedding-profile", "embedded")
    listed = cli(hub, home, "models", "list", "--json", "--offline", *ecapa, ECAPA_SOURCE=ECAPA)
    # Then `models list` lists it, for both stages that load it
    assert listed.returncode == 0, listed.stderr
    rows = {row["stage"]: row for row in json.loads(listed.stdout)}
    assert rows["enrollment, voice_profile"]["repo"] == ECAPA, rows
    assert "hub is off" in rows["enrollment, voice_profile"]["fallback_reason"]
    # And the stages that run an embedded model have rows too, needing no hub
    assert rows["asr"] == {
        "stage": "asr",
        "repo": "embedded",
        "revision": None,
        "cached": "embedded",
        "runs": rows["asr"]["runs"],
        "fallback_reason": None,
        "terms": None,
    }
    assert rows["asr"]["runs"].startswith("whisper tiny.en (embedded")
    assert rows["alignment"]["cached"] == "embedded" and rows["alignment"]["runs"] == "aligner by language"
    # And `models pull` fetches it, and offline it is listed as what runs
    pulled = cli(hub, home, "models", "pull", *ecapa, ECAPA_SOURCE=ECAPA)
    assert pulled.returncode == 0, pulled.stderr
    sha = repos()[ECAPA].sha
    assert lines(pulled.stderr) == [f"pulled enrollment, voice_profile: {ECAPA}@{sha} (2 files, 0.0 MiB)"]
    listed = cli(hub, home, "models", "list", "--json", *ecapa, ECAPA_SOURCE=ECAPA, HF_HUB_OFFLINE="1")
    (row,) = hub_rows(listed.stdout)
    assert row["runs"] == f"{ECAPA}@{sha}" and row["fallback_reason"] is None, row


def test_a_local_model_folder_that_does_not_exist_is_named_so(hub, tmp_path):
    missing = tmp_path / "nonexistent" / "dir"
    listed = cli(hub, tmp_path / "hf", "models", "list", "--json", "--offline", "--asr-model", str(missing))
    (row,) = [row for row in json.loads(listed.stdout) if row["stage"] == "asr"]
    assert row["fallback_reason"] == f"no such folder on this machine ({missing})", row
    pulled = cli(hub, tmp_path / "hf", "models", "pull", "--asr-model", str(missing), *ONLY_EMBEDDINGS[:2])
    assert pulled.returncode == 1
    assert f"FAILED asr: {missing}: no such folder on this machine" in pulled.stderr, pulled.stderr
