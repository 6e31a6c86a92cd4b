"""Load AgentDojo's task suites without its model clients.

AgentDojo's task-suite module imports its agent pipeline, which imports the Cohere and Google GenAI
SDKs at module level; this benchmark never calls a model, and installing those SDKs would
downgrade packages the integration tests use (google-genai caps tenacity and websockets). So the
test command installs `agentdojo` without its dependencies (README.md) and, when either SDK is
missing, this module puts an inert placeholder in its place before AgentDojo is imported: any
name imported from it is a class that refuses to be instantiated.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from typing import Any

_PLACEHOLDERS = (
    "cohere",
    "cohere.types",
    "cohere.core",
    "cohere.core.api_error",
    "google.genai",
    "google.genai.types",
    "google.genai.errors",
)


class _Absent:
    """A name of an SDK that is not installed: usable in annotations, never instantiated."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("this model SDK is not installed (bench/damage never calls a model)")

    def __class_getitem__(cls, _item: Any) -> type[_Absent]:
        return cls


class _Placeholder(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        absent = type(name, (_Absent,), {"__module__": self.__name__})
        setattr(self, name, absent)
        return absent


def _missing(name: str) -> bool:
    if name in sys.modules:
        return isinstance(sys.modules[name], _Placeholder)
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:  # its parent package is missing
        return True


def _install_placeholders() -> None:
    for sdk in ("cohere", "google.genai"):
        if not _missing(sdk) or sdk in sys.modules:
            continue
        for name in _PLACEHOLDERS:
            if name.startswith(sdk) and name not in sys.modules:
                module = _Placeholder(name)
                module.__path__ = []  # a package, so that its submodules import
                sys.modules[name] = module
                parent, _, child = name.rpartition(".")
                if parent in sys.modules:
                    setattr(sys.modules[parent], child, module)
        if sdk == "google.genai" and "google" not in sys.modules and _missing("google"):
            google = types.ModuleType("google")
            google.__path__ = []
            google.genai = sys.modules["google.genai"]  # type: ignore[attr-defined]
            sys.modules["google"] = google


def get_suite(name: str, version: str) -> Any:
    """AgentDojo's suite `name` at benchmark `version` (e.g. "v1.2.1")."""
    _install_placeholders()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from agentdojo.task_suite.load_suites import get_suite as load  # noqa: PLC0415

        return load(version, name)


def available() -> bool:
    """Whether AgentDojo is installed."""
    return not _missing("agentdojo")
