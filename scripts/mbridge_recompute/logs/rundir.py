"""One run as the tools read it: its log, its manifest.json and its ConfigContainer.yaml.

A run is a harness run directory (RUN/log.txt, RUN/manifest.json, RUN/ConfigContainer.yaml, as
runs/launch.py writes them) or a log file with those two beside it. `check --run`, `compare` and
`diagnose` all read a run through `RunDir`, so each file is read at most once per invocation and
by the same reader (files.py): the same dump or manifest is read, or refused, alike by every tool.

A name beside the log is absent only when nothing is there. Anything that is there -- a link to
a device, a FIFO, a directory, a link to nothing, a document that is not a mapping -- is input:
it is read, or refused with exit 2 naming the file, never taken for "the run wrote none".
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from mbridge_recompute import files
from mbridge_recompute.errors import InputError
from mbridge_recompute.logs import runlog

_UNREAD = object()


class RunDir:
    """The files of one run, each read on first use and then kept."""

    def __init__(self, given: str, field: Optional[str] = None, config: Optional[str] = None,
                 config_field: str = "--run-config"):
        """`field` names the run in errors (default: the log's path); `config` is a dump that is
        not beside the log, named `config_field`."""
        if not str(given).strip():
            raise InputError(field or "LOG", "is empty")
        self.given = str(given)
        p = Path(given)
        if p.is_dir():
            self.log_path = p / runlog.LOG
            if not files.exists(self.log_path):
                raise InputError(field or str(p), f"is a directory without {runlog.LOG}")
        else:
            self.log_path = p
        self.field = field or str(self.log_path)
        here = self.log_path.parent
        self.manifest_path = here / runlog.MANIFEST
        if config is not None:
            if not str(config).strip():
                raise InputError(config_field, "is empty")
            self.dump_path, self.dump_field = Path(config), config_field
            if not files.exists(self.dump_path):
                raise InputError(config_field, f"no such file: {config}")
        else:
            self.dump_path, self.dump_field = here / runlog.CONFIG_DUMP, str(here / runlog.CONFIG_DUMP)
        self._manifest = _UNREAD
        self._dump = _UNREAD
        self._log: Optional[runlog.RunLog] = None

    # ---- the manifest
    @property
    def manifest(self) -> Optional[dict]:
        """manifest.json as a checked mapping, or None when there is none."""
        if self._manifest is _UNREAD:
            where = str(self.manifest_path)
            self._manifest = None
            if files.exists(self.manifest_path):
                self._manifest = runlog.check_manifest(files.read_json(self.manifest_path, where, "manifest"),
                                                       where)
        return self._manifest

    # ---- the config dump
    @property
    def dump(self) -> Optional[dict]:
        """ConfigContainer.yaml as a nested mapping, or None when there is none.

        Bridge writes it with `yaml.safe_dump` (models/config.py:231 @ megatron-bridge 0.6.2), so
        a Python tag, a duplicate key or a non-mapping document is not a dump Bridge wrote.
        """
        if self._dump is _UNREAD:
            self._dump = None
            if files.exists(self.dump_path):
                data = files.read_yaml(self.dump_path, self.dump_field, "config dump")
                if data is None:
                    raise InputError(self.dump_field, "is empty (a config dump is a mapping with a model: "
                                                      "section)")
                if not isinstance(data, dict):
                    raise InputError(self.dump_field, f"must be a mapping (a ConfigContainer dump), got "
                                                      f"{type(data).__name__}")
                self._dump = data
        return self._dump

    @property
    def has_dump(self) -> bool:
        return self.dump is not None

    # ---- the log
    def parse(self, watch=None, name: Optional[str] = None, then=(),
              with_config: bool = True) -> runlog.RunLog:
        """The run's log parsed (streamed, once), with its manifest, setting and (`with_config`)
        its flattened config dump attached; `then`: lines read after the log's (a message pasted
        beside it)."""
        if self._log is None:
            manifest = self.manifest
            name = name or runlog.run_name(self.log_path, manifest)
            run = runlog.parse_path(self.log_path, self.field, name, watch, then)
            run.manifest = manifest
            dump = self.dump if with_config else None
            run.config = runlog.flatten(dump, self.dump_field) if dump is not None else None
            run.setting = runlog.manifest_setting(manifest)
            self._log = run
        return self._log


def parse_file(path: str | Path, name: Optional[str] = None, watch=None) -> runlog.RunLog:
    """Parse one log file (or a run directory's log.txt), with the manifest.json and
    ConfigContainer.yaml beside it when present, each read once."""
    return RunDir(str(path), field=str(path)).parse(watch=watch, name=name)
