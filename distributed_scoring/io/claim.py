"""Claiming an output folder: what every command does before it writes its first byte there.

`claim` refuses an `--output` that is empty, that is one of the run's inputs or inside an input folder,
that holds an input, or that is the model's folder (the run would read its own results back as input, or
`--overwrite` would delete what it reads); then it takes the folder's lock (`lock.py`) for as long as the
command writes there, derived reports included. The `Claim` it yields admits the folder for one run
(`Claim.admit`): a folder of the same run resumes, one of another run is refused unless `--overwrite`, and
a folder that is not empty but holds no run (the user's own files) is refused whatever the flags. Then
`Claim.begin` writes `_run.json`. A command with sub-runs (rescore's `mlm/`, joints' `scores/`, train's
evaluations) holds its folder while each sub-run claims its own inside it. A training folder, which holds
no shards but Ray Train's checkpoints, is claimed through `claim_training`.

`--overwrite` deletes exactly what the previous run wrote (`clear_run`): its shards (named by their markers
and by the plan `_run.json` records), its temporary files, the files and sub-runs it recorded in
`_run.json` (`OUTPUTS`, recorded as the run declares or writes them) and `_run.json`; the user's files in
the folder, `rows/` and `_done/` included, stay. Folders written before `OUTPUTS` existed lose the
names that earlier versions wrote beside such a run (`earlier_outputs`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import UserError
from .lock import FolderLock
from .output import DONE_DIR, LOCK_FILE, OUTPUTS, ROWS_DIR, RUN_FILE, SHARDS, OutputDir, OutputError
from .storage import check_bucket, check_output_key, join, scheme, storage_error

logger = logging.getLogger(__name__)

TRAINING = "train-"  # the prefix of a training run's workload name in `_run.json`
# What the commands wrote beside their runs before `_run.json` recorded it, deleted by --overwrite of such a
# folder: a fixed list (newer runs record theirs). A folder name means the folder; a sub-run's, what its run wrote.
EARLIER_OUTPUTS = (
    "summary.json",
    "report.md",
    "audit.json",
    "report.html",
    "row_stats.parquet",
    "outliers.parquet",
    "energy.png",
)
EARLIER_GENERATE_OUTPUTS = (*EARLIER_OUTPUTS, "prompts")
EARLIER_TRAIN_OUTPUTS = (
    "data",
    "checkpoints",
    "evaluation",
    "metrics.jsonl",
    "report.json",
    "heldout_predictions.parquet",
)


def earlier_outputs(previous: dict) -> tuple[str, ...]:
    """What the run of an earlier dscore's `_run.json` wrote beside its shards, by its workload."""
    workload = str(previous.get("workload", ""))
    if workload.startswith(TRAINING):
        return EARLIER_TRAIN_OUTPUTS
    return EARLIER_GENERATE_OUTPUTS if workload == "generate" else EARLIER_OUTPUTS


def _place(uri: str) -> str:
    """Where `uri` points, comparable with another's: a resolved local path, or scheme://path."""
    s = scheme(uri)
    if s in (None, "file"):
        return os.path.realpath(os.path.expanduser(uri.split("://", 1)[1] if s else uri))
    return f"{s}://{posixpath.normpath(uri.split('://', 1)[1])}"


def _within(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def check_paths(output: str, inputs: Iterable[str] = (), models: Iterable[str] = (), own: Iterable[str] = ()) -> None:
    """Refuse an --output the run cannot safely write: empty, equal to an input, inside an input (a folder),
    holding an input (unless the input is one of `own`, written into the folder by this run), or a model's
    folder. Globs are checked through the files they matched (pass those among `inputs`)."""
    if not output.strip():
        raise OutputError(
            "--output is empty: pass the folder to write the run to (a new or empty one, or the "
            "folder of the same run to resume it)"
        )
    check_output_key(output)
    out = _place(output)
    mine = {posixpath.join(out, name) for name in own}
    for given in dict.fromkeys(inputs):
        if any(c in given for c in "*?["):
            continue
        place = _place(given)
        if place == out:
            raise OutputError(
                f"--output {output} is the input {given}: the run would read its own results as input; "
                "pass another --output"
            )
        if _within(out, place):
            raise OutputError(
                f"--output {output} is inside the input folder {given}: a rerun would read the results "
                "as input; pass an --output outside it"
            )
        if _within(place, out) and place not in mine:
            raise OutputError(
                f"the input {given} is inside --output {output}: the run would read results of a run "
                "(and --overwrite could delete it); pass an --output that holds none of the inputs"
            )
    for model in models:
        if scheme(model) is None and os.path.isdir(model) and _place(model) == out:
            raise OutputError(f"--output {output} is the model's folder {model}: pass another --output")


@contextlib.contextmanager
def claim(output: str, inputs: Iterable[str] = (), models: Iterable[str] = ()) -> Iterator[Claim]:
    """Check the paths (`check_paths`), then hold the folder's lock while the body runs (released at its
    end, also on error); nothing is written before the lock is held. A folder the claim created is removed
    again when the body fails and leaves it empty (a refusal after the claim, such as repeated ids found by a
    command that claims before it plans), so that a refused run leaves no trace."""
    check_paths(output, inputs, models)
    out = OutputDir(output)
    check_bucket(output, out.fs)
    try:
        created = not out.exists(out.root)
    except OSError as exc:
        raise storage_error(output, exc, "use the output folder") from exc
    try:
        with FolderLock(out):
            held = Claim(out)
            try:
                yield held
            except UserError:  # a check that refused the run after the claim: the folder as it was found
                with contextlib.suppress(OSError):
                    held.withdraw()
                raise
    except BaseException:
        if created:
            with contextlib.suppress(OSError):  # the error that ended the run is the one to tell
                _delete_if_empty(out, out.root)
        raise


@contextlib.contextmanager
def claim_training(
    output: str,
    run: dict,
    overwrite: bool = False,
    inputs: Iterable[str] = (),
    models: Iterable[str] = (),
    outputs: Iterable[str] = (),
) -> Iterator[Claim]:
    """Hold a training folder while the body runs (`claim`), `run` (its `_run.json`, its workload named
    `TRAINING` + the command) begun in it with what it writes (`outputs`). A folder of the same run is
    continued; one of another training run is refused unless `overwrite`, which deletes what that run wrote
    first (its checkpoints would otherwise be resumed); a folder of a run of another command, or with
    anything else in it, is never emptied."""
    if scheme(output) not in (None, "file"):
        raise OutputError(
            f"--output {output!r}: a trained model is a folder that transformers loads, so dscore train "
            "writes to a local or shared-filesystem path, not an object store"
        )
    with claim(output, inputs, models) as folder:
        try:
            previous = folder.out.read_json(RUN_FILE)
        except ValueError as exc:  # --overwrite could not tell which files were the run's: its checkpoints
            raise OutputError(f"{folder.out.uri}/{RUN_FILE} is damaged ({exc}); use another --output") from exc
        if previous is not None and not str(previous.get("workload", "")).startswith(TRAINING):
            raise OutputError(
                f"{folder.out.uri} holds a {previous.get('workload')!r} run, not a training run; use another --output"
            )
        previous = folder.admit(run, overwrite)
        if previous is not None:
            logger.info("continuing the training run in %s", folder.out.uri)
        folder.begin(run, previous, outputs)
        yield folder


class Claim:
    """An output folder this process holds: admits one run into it and records what that run writes."""

    def __init__(self, out: OutputDir) -> None:
        self.out = out
        self.outputs: list[str] = []  # what the run wrote (or will write) beside its shards
        self.written: set[str] = set()  # what it wrote before it was admitted (generated inputs)
        self.run: dict | None = None  # its `_run.json`, once begun
        self._found: set[str] = set()  # the folder's entries when the run was admitted
        self.fresh = False  # admitted into a folder that held no run (or whose run --overwrite deleted)

    def _previous(self) -> dict | None:
        """The folder's `_run.json`, or None; a damaged one is refused with what to do."""
        try:
            return self.out.read_json(RUN_FILE)
        except ValueError as exc:
            raise OutputError(
                f"{self.out.uri}/{RUN_FILE} is damaged ({exc}), so this folder's run cannot be identified; pass "
                "--overwrite to replace its results, or use another --output"
            ) from exc

    def admit(self, run: dict, overwrite: bool, partial: bool = False, earlier: tuple[str, ...] = ()) -> dict | None:
        """Admit `run` before it writes: returns the `_run.json` of the same run to resume, or None to start
        afresh. Another run is refused unless `overwrite`, which deletes what that run wrote (and, with the
        same run, restarts it); a non-empty folder holding no run is refused. `partial`: compare only the
        keys of `run` (a run whose plan is not known yet). `earlier`: the names of an earlier dscore's folder
        of this command that held no `_run.json` of its own but its sub-runs'."""
        try:
            previous = self._previous()
        except OutputError:
            if not overwrite:
                raise
            previous = {}
        if previous is None:
            strange = self._entries() - {name.split("/")[0] for name in self.written}
            if strange and not self._earlier_run(strange, earlier):
                shown = ", ".join(sorted(strange)[:3]) + (", ..." if len(strange) > 3 else "")
                raise OutputError(
                    f"{self.out.uri} is not empty ({shown}) and holds no {RUN_FILE} of a dscore run: a run writes "
                    "only into an empty folder or one of its own, and --overwrite deletes only what a run wrote, so "
                    "nothing was changed; use an empty or a new --output"
                )
            if strange and overwrite:
                clear_run(self.out, {}, earlier)
        elif overwrite:
            clear_run(self.out, previous)
            previous = None
        else:
            self.out.refuse_another(previous, run, run.keys() if partial else None)
        self._found = self._entries()
        self.fresh = previous is None
        return previous

    def withdraw(self) -> None:
        """Undo a run refused by a check after it was begun and before it finished any shard (a model only its
        loader finds unusable): what it wrote is deleted, so that the folder is as it was found and the corrected
        command is no "different run". A folder that held a run, a training run's and any with a finished shard
        keep what they hold."""
        if self.run is None or not self.fresh or str(self.run.get("workload", "")).startswith(TRAINING):
            return
        infos = self.out.fs.get_file_info(pafs.FileSelector(self.out.root, recursive=True, allow_not_found=True))
        if any(f"/{DONE_DIR}/" in info.path and info.path.endswith(".json") for info in infos):
            return
        clear_run(self.out, self.run)

    def begin(self, run: dict, previous: dict | None, outputs: Iterable[str] = ()) -> None:
        """Write `_run.json`: `run` and what it writes beside its shards (`outputs`, declared now; those
        written so far; a resumed run's earlier records)."""
        earlier = previous.get(OUTPUTS, []) if previous else []
        self.outputs = sorted({*earlier, *self.outputs, *outputs})
        self.run = {**run, OUTPUTS: self.outputs}
        with self.out.writing():  # before any work: a full disk here is an error line (exit 2), not a traceback
            self.out.write_json(RUN_FILE, self.run)

    def declare(self, *names: str) -> None:
        """Files the run will write beside its shards, recorded when it begins (`begin`'s `outputs`)."""
        self.outputs = sorted({*self.outputs, *names})

    def record(self, *names: str) -> None:
        """Add files or folders (relative to the folder) to what the run wrote; before writing what another
        process writes (a sub-run, Ray Train's checkpoints), after writing what this one writes."""
        if self.run is None:
            self.written.update(names)
        new = [name for name in names if name not in self.outputs]
        if not new:
            return
        self.outputs = sorted([*self.outputs, *new])
        if self.run is not None:
            self.run = {**self.run, OUTPUTS: self.outputs}
            self.out.write_json(RUN_FILE, self.run)

    def record_new(self) -> None:
        """Record every entry that appeared since the run was admitted (files its workers wrote: a model)."""
        known = {RUN_FILE, ROWS_DIR, DONE_DIR, *(name.split("/")[0] for name in self.outputs)}
        self.record(*sorted(self._entries() - self._found - known))

    def subfolder(self, name: str) -> str:
        """The URI of a sub-run's folder `name`, recorded before the sub-run writes."""
        self.record(name)
        return join(self.out.uri, name)

    def write_json(self, name: str, obj: dict) -> None:
        self.out.write_json(name, obj)
        self.record(name)

    def write_text(self, name: str, text: str) -> None:
        self.out.write_text(name, text)
        self.record(name)

    def write_table(self, name: str, table: pa.Table) -> str:
        """Write `table` as Parquet at `name`; returns where other processes find it."""
        location = self.out.write_table(name, table)
        self.record(name)
        return location

    def _entries(self) -> set[str]:
        """The names in the folder, but the lock and the temporary files of a write that was cut off."""
        infos = self.out.fs.get_file_info(pafs.FileSelector(self.out.root, allow_not_found=True))
        names = {posixpath.basename(i.path) for i in infos}
        return {n for n in names if n != LOCK_FILE and not (n.startswith(".") and n.endswith(".tmp"))}

    def _earlier_run(self, strange: set[str], earlier: tuple[str, ...]) -> bool:
        """Whether the entries are those of an earlier dscore's folder of this command: known names only,
        one of them a sub-run's folder."""
        return (
            bool(earlier)
            and strange <= set(earlier)
            and any(self.out.exists(self.out.path(name, RUN_FILE)) for name in strange)
        )


def clear_run(out: OutputDir, previous: dict, earlier: tuple[str, ...] = ()) -> None:
    """Delete what the run of `previous` (its `_run.json`; {} when unreadable or absent) wrote in `out`,
    and nothing else: its marked and planned shards, their temporary files, its recorded outputs (else
    `earlier`, else `earlier_outputs`) and `_run.json`; folders left empty go too."""
    with out.writing():
        for key in set(out.marker_keys()) | set(previous.get(SHARDS) or ()):
            _delete(out, out.part_path(key))
            _delete(out, out.path(DONE_DIR, f"{key}.json"))
        for temporary in out.files(ROWS_DIR, suffix=".tmp") + out.files(DONE_DIR, suffix=".tmp"):
            out.fs.delete_file(temporary)
        outputs = previous[OUTPUTS] if OUTPUTS in previous else earlier or earlier_outputs(previous)
        for name in outputs:
            _delete_output(out, name)
        _delete(out, out.path(RUN_FILE))
        for folder in {ROWS_DIR, DONE_DIR, *(posixpath.dirname(name) for name in outputs)} - {""}:
            _delete_if_empty(out, out.path(folder))


def _delete_output(out: OutputDir, name: str) -> None:
    """A recorded output: a file, a sub-run's folder (what its run wrote), or a folder the run owns whole."""
    info = out.fs.get_file_info(out.path(name))
    if info.type == pafs.FileType.File:
        out.fs.delete_file(info.path)
    elif info.type == pafs.FileType.Directory and out.exists(out.path(name, RUN_FILE)):
        sub = OutputDir(join(out.uri, name))
        try:
            previous = sub.read_json(RUN_FILE) or {}
        except ValueError:
            previous = {}
        clear_run(sub, previous)
        _delete_if_empty(out, info.path)
    elif info.type == pafs.FileType.Directory:
        out.fs.delete_dir(info.path)


def _delete(out: OutputDir, path: str) -> None:
    if out.fs.get_file_info(path).type == pafs.FileType.File:
        out.fs.delete_file(path)


def _delete_if_empty(out: OutputDir, path: str) -> None:
    info = out.fs.get_file_info(path)
    if info.type == pafs.FileType.Directory and not out.fs.get_file_info(pafs.FileSelector(path)):
        out.fs.delete_dir(path)
