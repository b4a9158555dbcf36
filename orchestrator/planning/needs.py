"""What each input needs this run: the stages whose artifact is not current and that a kept artifact depends
on, or nothing at all when the journal saw it completed with the same outputs fingerprint and its files are
the very ones validated then (the fast resume); and the dry run's plan of all that. Reads artifacts and the
journal; starts no child."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from pathlib import Path

from contracts import SourceVersion, WorkItem
from contracts.artifacts import LanguageId
from contracts.report import ItemStage, RunPlan, StagePlan
from orchestrator import layout
from orchestrator.books.journal import Completed, Journal
from orchestrator.models.choice import model_label, same_model
from orchestrator.planning.fingerprints import artifact_state, chain_fingerprints, input_keys, plan_aligner
from orchestrator.planning.inputs import plan_inputs
from orchestrator.planning.state import InputState
from orchestrator.registry import StageSpec
from orchestrator.remote import configure as configure_remote
from orchestrator.remote import without_credentials
from orchestrator.settings import Settings

log = logging.getLogger(__name__)

#: the one report entry of a stage an input reused (frozen: shared by every such input of a large run)
REUSED = ItemStage(status="reused")
#: bump when the files written from the artifacts change (captions, TXT, segments.jsonl): every input's
#: outputs are then rewritten on the next run
OUTPUTS_VERSION = 3  # 3: corpus speakers' labels, overlapping voices


def work_item(spec: StageSpec, inp: InputState, previous: StageSpec | None) -> WorkItem:
    """What ``spec``'s child gets for ``inp``: the artifacts it reads, where it writes, the fingerprint."""
    if previous is None:
        inputs = {"source": str(inp.source)}
    else:  # artifacts a fast path went on without are left out (stages treat them as optional)
        inputs = {key: inp.artifact_file(key) for key in input_keys(spec, previous) if key not in inp.skipped}
    return WorkItem(
        id=inp.id,
        inputs=inputs,
        output=inp.artifact_file(spec.kind),
        fingerprint=inp.fingerprints[spec.name],
        source_version=SourceVersion(size=inp.planned[0], mtime_ns=inp.planned[1])
        if previous is None and inp.planned and not inp.url
        else None,
        vocabulary=list(inp.plan.vocabulary) if spec.vocabulary else [],
    )


def needs(
    inp: InputState, specs: list[StageSpec], force: bool, reasons: dict[str, str] | None = None
) -> dict[str, bool]:
    """Which stages must run for ``inp``: a stage whose artifact is not current, if a kept artifact
    depends on it. A later current artifact spares its upstream stages entirely. ``reasons`` gets
    why, for each stage that must run (the dry run's)."""
    needed: dict[str, bool] = {}
    read: set[str] = set()  # artifacts that a stage which runs reads
    states: dict[str, tuple] = {}
    # first the aligner the transcript would get now: the fingerprints after it follow from it
    aligned = None if force else _alignment_state(inp, specs, quiet=reasons is not None)
    for index in range(len(specs) - 1, -1, -1):
        spec = specs[index]
        previous = specs[index - 1] if index else None
        if force:
            artifact, state = None, "forced (--force)"
        elif spec.name == "alignment" and aligned is not None:
            artifact, state = aligned
        else:  # no work item: planning a corpus asks this of every artifact
            artifact, state = artifact_state(
                inp.artifact_file(spec.kind),
                inp.id,
                inp.fingerprints[spec.name],
                spec.output,
                reasons is not None,
            )
        states[spec.name] = (artifact, state)
        needed[spec.name] = state != "current" and (spec.keep or spec.kind in read)
        if needed[spec.name]:
            read |= set(input_keys(spec, previous))
    if reasons is not None:
        redone: set[str] = set()
        for index, spec in enumerate(specs):
            if not needed[spec.name]:
                continue
            artifact, state = states[spec.name]
            upstream = [k for k in input_keys(spec, specs[index - 1] if index else None) if k in redone]
            if state == "stale":
                was, now = model_label(spec.name, artifact), inp.models.get(spec.name) or spec.model
                if was is not None and now is not None and not same_model(was, now):
                    state = f"model {was} -> {now}"
                elif upstream:
                    state = f"its input ({upstream[0]}) is redone"
                else:
                    state = "settings, code or source changed"
            elif state == "missing" and not spec.keep:
                state = "scratch, needed by a stage that runs"
            reasons[spec.name] = state
            redone.add(spec.kind)
    return needed


def _alignment_state(inp: InputState, specs: list[StageSpec], quiet: bool) -> tuple | None:
    """:func:`artifact_state` of the transcript, its fingerprint made with the aligner that would run now for
    its language (``orchestrator.planning.inputs.plan_aligner``): a transcript timed by Whisper's cross-attention is
    redone once the wav2vec2 aligner of its language can be had, and kept while it cannot. None without an
    alignment stage."""
    index = next((i for i, s in enumerate(specs) if s.name == "alignment"), None)
    if index is None:
        return None
    spec = specs[index]
    path = inp.artifact_file(spec.kind)
    artifact, state = artifact_state(path, inp.id, inp.fingerprints[spec.name], spec.output, quiet=True)
    if artifact is not None and plan_aligner(inp, specs, getattr(artifact, "language", None)):
        current = artifact.fingerprint == inp.fingerprints[spec.name] and artifact.item_id == inp.id
        state = "current" if current else "stale"
    if state == "stale" and not quiet:
        log.info("redoing %s: transcript.json is stale (inputs, settings or aligner changed)", inp.id)
    return artifact, state


def stages_needed(
    resume: Resume,
    inp: InputState,
    specs: list[StageSpec],
    force: bool,
    reasons: dict[str, str] | None = None,
) -> dict[str, bool]:
    """:func:`needs`, or no stage at all for an input the journal saw completed (``resume.complete``, which
    then marks it complete)."""
    if resume.complete(inp, specs):
        return dict.fromkeys((s.name for s in specs), False)
    return needs(inp, specs, force, reasons)


class Resume:
    """The journal's completed inputs for one run (or dry run): the outputs fingerprint an input must have
    to be reused from the journal alone, and what the journal keeps of an input it completes."""

    def __init__(self, settings: Settings, completed: dict[str, Completed]) -> None:
        self.settings = settings
        #: item id -> its last "outputs ok" journal event (each checked once a run, then freed)
        self.completed = completed
        #: inputs of this run reused from the journal alone
        self.fast_resumed = 0
        #: journal summaries' languages, validated (JSON -> LanguageId)
        self._languages: dict[str, LanguageId] = {}
        shaping = {
            k: v for k, v in settings.model_dump(mode="json").items() if k.startswith(("caption_", "export_"))
        }
        self._shaping = json.dumps(
            {
                "outputs": shaping,
                "version": OUTPUTS_VERSION,
                "langid_only": settings.langid_only,
                "output_url": without_credentials(settings.output_url or ""),
            },
            sort_keys=True,
        )

    def outputs_fingerprint(self, inp: InputState) -> str:
        """What an input's outputs are made from: every stage's fingerprint and the settings that shape the
        written files (captions, where outputs go, langid-only), so a change of either rewrites them. Made
        again only when the stage fingerprints changed since it was last asked."""
        made_from = (self._shaping, *inp.fingerprints.items())  # this run's settings, its fingerprints
        memo = inp.outputs_memo
        if memo is not None and memo[0] == made_from:
            return memo[1]
        blob = json.dumps(inp.fingerprints, sort_keys=True) + self._shaping
        value = hashlib.sha256(blob.encode()).hexdigest()[:32]
        inp.outputs_memo = (made_from, value)
        return value

    def resumed(self, inp: InputState, specs: list[StageSpec] | None = None) -> bool:
        """The journal saw ``inp`` completed with its current outputs fingerprint (the progress's count).
        With ``specs``, its fingerprints are chained first, once: the aligner is planned for the
        transcript's language the journal names (as :meth:`complete` will) before the chain, so an input
        the journal saw is not chained again for it (a corpus has 100,000)."""
        done = self.completed.get(inp.id)
        if specs is not None:
            if done is not None and done.text_language:
                plan_aligner(inp, specs, done.text_language)
            if len(inp.fingerprints) < len(specs):  # no aligner to plan, or it chained nothing
                chain_fingerprints(inp, specs)
        return done is not None and done.fingerprint == self.outputs_fingerprint(inp)

    def complete(self, inp: InputState, specs: list[StageSpec]) -> bool:
        """An input the journal saw completed with the same outputs fingerprint, whose files are still the
        very ones (size and modification time) validated then: reused without reading them again (its run
        state filled from the journal's summary)."""
        # outputs at a URL are uploaded again by every run (a lost upload is redone)
        if self.settings.output_url:
            return False
        done = self.completed.pop(inp.id, None)  # each input is checked once a run; what is checked is freed
        if done is None or not inp.alive:
            return False
        event = done.event()
        files, summary = event.get("files"), event.get("summary")
        language = summary.get("text_language") if isinstance(summary, dict) else None
        # the aligner it would get now (planned already when :meth:`resumed` chained it for this language)
        if language and language != inp.text_language:
            plan_aligner(inp, specs, language)
        if done.fingerprint != self.outputs_fingerprint(inp):
            return False
        if not isinstance(files, dict) or not files or not isinstance(summary, dict):
            return False  # a journal of an earlier version: check the artifacts themselves
        directory = f"{inp.directory}{os.sep}"  # joined as text: 100,000 inputs have about ten files each
        for name, (size, mtime_ns) in files.items():
            try:
                st = os.stat(directory + name)
            except (OSError, TypeError, ValueError):  # gone, or a name no file can have
                return False
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                return False
        try:
            inp.language = self._language(summary.get("language"))
        except ValueError:
            return False
        inp.duration_s, inp.outputs, inp.damage = (
            summary.get("duration_s"),
            summary.get("outputs") or {},
            summary.get("damage"),
        )
        overlap = summary.get("overlap_s")
        inp.overlap_s = float(overlap) if isinstance(overlap, (int, float)) else None
        inp.notes.extend(summary.get("notes") or [])
        inp.substitutions = list(summary.get("substitutions") or [])
        inp.stages = {spec.name: REUSED for spec in specs if spec.keep}
        self.fast_resumed += 1
        inp.complete = True
        return True

    def _language(self, raw: dict | None) -> LanguageId | None:
        """A journal summary's language, validated once per distinct value (a corpus has few)."""
        if not raw:
            return None
        key = repr(raw)  # the same text is the same value (another order of the same value: one more entry)
        cache = self._languages
        if key not in cache:
            if len(cache) > 10_000:
                cache.clear()
            cache[key] = LanguageId.model_validate(raw)
        return cache[key]


def completion(inp: InputState, specs: list[StageSpec]) -> dict:
    """What the journal keeps of a completed input so that a rerun can reuse it without reading its
    artifacts: each kept file's size and modification time, and what the report shows; and every note its
    page shows, so that ``pipeline export`` writes them again (the plan's apart: a rerun has its own)."""
    plan_notes = len(inp.plan.notes)
    notes = inp.notes[plan_notes:]
    files = {}
    for path in [*(inp.artifact(s.kind) for s in specs if s.keep), *map(Path, inp.outputs.values())]:
        try:
            st = path.stat()
        except OSError:  # an uploaded output (a URL): nothing local to check
            continue
        files[path.name] = [st.st_size, st.st_mtime_ns]
    summary = {
        "duration_s": inp.duration_s,
        "outputs": inp.outputs,
        "notes": notes,
        "overlap_s": inp.overlap_s,
        "substitutions": inp.substitutions,
        "damage": inp.damage,
        "language": inp.language.model_dump(mode="json") if inp.language else None,
        "text_language": inp.text_language,
    }
    if plan_notes:
        summary["plan_notes"] = list(inp.plan.notes)
    return {"files": files, "summary": summary}


def dry_run(settings: Settings, specs: list[StageSpec], paths: list[str | Path], clock: float) -> RunPlan:
    """What a run of ``paths`` would do, stage by stage, with the reasons (``clock``: when planning began,
    on ``time.monotonic``). Starts no child, writes nothing."""
    out = Path(settings.output_dir)
    configure_remote(settings)  # planning's calls to URLs use these timeouts
    skipped: list[str] = []
    inputs = [InputState(inp) for inp in plan_inputs(paths, out, dry=True, skipped=skipped)]
    journal = layout.path(out, layout.JOURNAL)
    resume = Resume(
        settings, {} if settings.force or not journal.exists() else Journal(journal, "plan").completed()
    )
    reuse = {spec.name: 0 for spec in specs}
    redo: dict[str, Counter] = {spec.name: Counter() for spec in specs}
    complete = 0
    for inp in inputs:
        resume.resumed(inp, specs)  # fingerprints chained
        reasons: dict[str, str] = {}
        needed = stages_needed(resume, inp, specs, settings.force, reasons)
        complete += not any(needed.values())
        for spec in specs:
            if needed[spec.name]:
                redo[spec.name][reasons[spec.name]] += 1
            elif spec.keep:
                reuse[spec.name] += 1
    duplicates = sum(1 for inp in inputs for note in inp.notes if note.startswith("given "))
    stages = [
        StagePlan(
            stage=spec.name,
            model=spec.model,
            reuse=reuse[spec.name],
            redo=sum(redo[spec.name].values()),
            reasons=dict(redo[spec.name]),
        )
        for spec in specs
    ]
    return RunPlan(
        output_dir=str(out),
        inputs=len(inputs),
        duplicates=duplicates,
        skipped=skipped,
        complete=complete,
        stages=stages,
        seconds=time.monotonic() - clock,
    )
