"""Numbers as a person reads them: durations and SI-prefixed magnitudes, the one
spelling every table, progress line and figure uses."""

from __future__ import annotations


def axis_value(value: object) -> str:
    """An axis value as a study file writes it: ``true``/``false``, ``null``, anything else as ``str``
    (``memory=false`` in a label reads as the study says it, and `compare --baseline` takes it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def axes_text(axes: dict, *, leave_out: tuple[str, ...] = (), separator: str = " ") -> str:
    """``num_layers=2 memory=false``: the axes (but ``leave_out``) as ``name=value``, in their order."""
    return separator.join(f"{name}={axis_value(value)}" for name, value in axes.items() if name not in leave_out)


def duration(seconds: float) -> str:
    """``45`` -> ``45 s``; ``600`` -> ``10.0 min``; ``7200`` -> ``2.0 h``; ``259200`` -> ``3.0 d``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def si(value: float) -> str:
    """``200000`` -> ``200k``, ``1.5e9`` -> ``1.5G``, ``2.5`` -> ``2.5``: three significant figures."""
    for power, suffix in ((12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if abs(value) >= 10 ** power:
            return f"{value / 10 ** power:.3g}{suffix}"
    return f"{value:.3g}"
