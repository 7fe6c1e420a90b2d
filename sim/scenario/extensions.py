"""User extensions: modules or .py files named in SERVESIM_EXTENSIONS, imported once so that they can register
policies, workloads, GPUs and models before a scenario is built (the CLI, sweep workers and notebooks alike)."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path

from costmodels.errors import UserError

ENV = "SERVESIM_EXTENSIONS"
_loaded: set = set()
# "ITEM replaced the policy 'vllm'" for each built-in an extension replaced (replace=True); the CLI prints them
REPLACEMENTS: list = []


def load_extensions(names: str | None = None) -> list:
    """Import each comma-separated module name or .py path (from `names`, else the environment) not yet
    imported; returns those imported now. A failure is one line naming the extension and where it broke."""
    from costmodels.registry import take_replacements
    text = os.environ.get(ENV, "") if names is None else names
    done = []
    take_replacements()                 # the package's own registrations are not an extension's doing
    for item in (x.strip() for x in text.split(",")):
        if not item or item in _loaded:
            continue
        try:
            if item.endswith(".py"):
                _import_file(item)
            else:
                importlib.import_module(item)
        except UserError as e:
            raise UserError(f"{ENV}: {item}: {e}") from None
        except Exception as e:
            frame = traceback.extract_tb(e.__traceback__)[-1]
            raise UserError(f"{ENV}: cannot load {item!r}: {type(e).__name__}: {e} "
                            f"({Path(frame.filename).name}:{frame.lineno})") from None
        _loaded.add(item)
        done.append(item)
        REPLACEMENTS.extend(f"{ENV}: {item} replaced the {what} {name!r} (it said replace=True)"
                            for what, name in take_replacements())
    return done


def _import_file(item: str) -> None:
    path = Path(item).expanduser().resolve()
    if path.is_dir():
        raise UserError("is a directory; name a .py file or an importable module")
    if not path.is_file():
        raise UserError("file does not exist")
    name = f"servesim_extension_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module         # dataclasses and pickling look the module up by name
    spec.loader.exec_module(module)
