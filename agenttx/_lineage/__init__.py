"""Value-provenance lineage: which tool call fed which, from the values they passed."""

from __future__ import annotations

from ._recorder import LineageEdge as LineageEdge
from ._recorder import LineageGraph as LineageGraph
from ._recorder import LineageNode as LineageNode
from ._recorder import LineageRecorder as LineageRecorder
from ._recorder import is_call_id as is_call_id
from ._sources import LineageStep as LineageStep
from ._sources import lineage_from_openai as lineage_from_openai
from ._sources import lineage_from_steps as lineage_from_steps

__all__ = [
    "LineageEdge",
    "LineageGraph",
    "LineageNode",
    "LineageRecorder",
    "LineageStep",
    "is_call_id",
    "lineage_from_openai",
    "lineage_from_steps",
]
