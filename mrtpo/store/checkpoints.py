"""Checkpoint files of a store's runs: written atomically (temp file, fsync, rename), keyed by run id, the last one
kept.  A checkpoint is the run's only when the store records it (:meth:`mrtpo.store.Store.write_step`).

They live in ``<db>.checkpoints/<run id>/`` beside the store's file (``runs/a.db`` → ``runs/a.db.checkpoints/``):
named by the store, so two stores in one folder never write, prune or resume from each other's files. Stores written
before this kept them in ``<db folder>/checkpoints/<run id>/`` (shared by every store of the folder); a run recorded
there still resumes from its file, its next checkpoint is written in the new place, and the old folder is never
pruned (another store may own what is in it)."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

from mrtpo.errors import MrtpoError
from mrtpo.store.common import RunInfo, disk_problem


class Checkpoints:
    """The checkpoint methods of :class:`mrtpo.store.Store` (they use its ``path``, ``_q``, ``get_run`` and
    ``check_owner``)."""

    @property
    def checkpoint_root(self) -> Path:
        """``<db>.checkpoints`` beside the store's file."""
        return self.path.with_name(self.path.name + ".checkpoints")

    def checkpoint_dir(self, run_id: int) -> Path:
        """``<db>.checkpoints/<run id>``: keyed by id, so a run's name never becomes a path."""
        return self.checkpoint_root / str(int(run_id))

    def checkpoint_file(self, run: RunInfo) -> Path | None:
        """The file of the run's last checkpoint (None before the first one).

        New stores record it relative to the store's folder; version-1 stores recorded it as written (absolute,
        or relative to the working directory then), which is tried second.
        """
        if not run.checkpoint_path or run.last_checkpoint <= 0:
            return None
        rel = self.path.parent / run.checkpoint_path
        return rel if rel.exists() or not Path(run.checkpoint_path).exists() else Path(run.checkpoint_path)

    def save_checkpoint(self, run_id: int, step: int, state: dict, *, owner: str) -> Path:
        """Write ``state`` (torch.save) to ``checkpoint_dir/step-NNNNNN.pt`` atomically; returns the path.

        Temp file in the same folder → fsync → ``os.replace`` → fsync of the folder. On any failure the temp file
        is removed and a write error (full disk, quota, read-only, permissions) is a MrtpoError naming the folder.
        The file is not the run's checkpoint until :meth:`write_step` records it.
        """
        import torch

        self.check_owner(run_id, owner)
        d = self.checkpoint_dir(run_id)
        path = d / f"step-{step:06d}.pt"
        tmp = d / f".step-{step:06d}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            d.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(d)
        except OSError as e:
            raise MrtpoError(
                f"cannot write the checkpoint of step {step} in {d}: {disk_problem(e)} ({e.strerror or e}). "
                f"Step {step} was not stored; free space there (or set $MRTPO_RUNS to a store on another disk) "
                f"and start the run again: it resumes from its last stored checkpoint") from None
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        return path

    def load_checkpoint(self, run: RunInfo) -> dict | None:
        """The state of the run's last checkpoint (None before the first one); MrtpoError if the file is gone."""
        import torch

        if run.last_checkpoint <= 0:
            return None
        path = self.checkpoint_file(run)
        if path is None:
            raise MrtpoError(f"run '{run.name}': the store records a checkpoint at step {run.last_checkpoint} but "
                             f"no file; delete the run")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise MrtpoError(f"run '{run.name}': checkpoint {path} of step {run.last_checkpoint} is missing; "
                             f"delete the run or restore the file") from None
        except (OSError, RuntimeError, EOFError) as e:
            raise MrtpoError(f"run '{run.name}': cannot read checkpoint {path} of step {run.last_checkpoint} "
                             f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None

    def prune_checkpoints(self, run_id: int, *, owner: str) -> None:
        """Delete the run's checkpoint files other than its recorded last one (and leftover temp files)."""
        self.check_owner(run_id, owner)
        rows = self._q("SELECT name FROM runs WHERE id = ?", (run_id,))
        run = self.get_run(rows[0][0]) if rows else None
        keep = self.checkpoint_file(run) if run else None
        d = self.checkpoint_dir(run_id)
        for p in [*d.glob("step-*.pt"), *d.glob(".step-*.tmp")]:
            if keep is None or p.resolve() != keep.resolve():
                try:
                    p.unlink(missing_ok=True)
                except OSError:
                    pass

    def drop_checkpoint_files(self, run_id: int, *, owner: str) -> None:
        """Delete every checkpoint file of the run (a finished run's weights, when only its stored steps matter).
        The store still records its last checkpoint, so training the run further is refused by
        :meth:`load_checkpoint` with a message naming the missing file; its steps are never recomputed."""
        self.check_owner(run_id, owner)
        d = self.checkpoint_dir(run_id)
        for p in [*d.glob("step-*.pt"), *d.glob(".step-*.tmp")]:
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass


def _fsync_dir(d: Path) -> None:
    """Make a rename in ``d`` durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

