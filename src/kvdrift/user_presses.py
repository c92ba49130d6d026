"""Presses of the user's own: press objects as actions, and families of them for the frontier.

A *presses file* is a Python file the user names (``kvdrift run --presses FILE``, ``kvdrift
study`` with ``presses = "FILE"`` in its TOML, ``kvdrift frontier --presses FILE``). It defines
``PRESSES``, a dict from action name to a kvpress press object, and may define ``FAMILIES``, a
dict from family name to a function of the ratio kept (a float in (0, 1)) returning a press::

    from kvpress import KnormPress
    PRESSES = {"knorm-third": KnormPress(compression_ratio=2 / 3)}
    FAMILIES = {"myknorm": lambda kept: KnormPress(compression_ratio=1 - kept)}

:func:`load_presses_file` is the only place such a file is executed: never from a run
directory, its ``run.json``, a study's recorded configuration or a model folder. It runs from
the bytes read once, never from a bytecode cache, and may import modules beside it and the
user's own modules elsewhere (:mod:`kvdrift.press_source`, after the checks of
:mod:`kvdrift.press_folder`); a press's identity digests all those bytes. A store
made with presses records their action names (``press_actions`` in ``run.json``), so resuming
it without the file is refused in one line saying what is missing
(:func:`refuse_missing_presses`). From Python, press objects are given directly
(:func:`from_actions`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvdrift import checks, press_folder, press_source
from kvdrift.lm.grammar.names import press_chain
from kvdrift.output import NotARegularFile

#: Where press names and objects came from, when not from a file.
FROM_PYTHON = "the Python call"
#: What a store's ``run.json`` records of the actions that were press objects.
RECORDED_KEY = "press_actions"


@dataclass(frozen=True)
class UserPresses:
    """Press objects by action name and press families by family name, checked."""

    presses: Mapping[str, Any] = field(default_factory=dict)  # action name -> press
    families: Mapping[str, Callable[[float], Any]] = field(default_factory=dict)
    source: str = FROM_PYTHON  # the file they came from, for messages

    def __bool__(self) -> bool:
        return bool(self.presses or self.families)

    def only(self, names: Iterable[str]) -> dict[str, Any]:
        """The presses of ``names`` that are press actions (spec strings are left out); a
        press chained with a quantizer (``mine+kivi:bits=4``) maps to its press."""
        out = {}
        for n in names:
            base = n if n in self.presses else press_chain(n, self.presses)
            if base is not None:
                out[n] = self.presses[base]
        return out

    def identities(self, names: Iterable[str]) -> dict[str, dict]:
        """Each press action's identity (:func:`~kvdrift.lm.actions.identity.press_identity`)."""
        chosen = self.only(names)
        if not chosen:  # no press object: kvpress is not imported
            return {}
        from kvdrift.lm.actions.identity import press_identity

        return {n: press_identity(p) for n, p in chosen.items()}

    def eager(self, names: Iterable[str], attention: str = "auto") -> list[str]:
        """The press actions among ``names`` whose prefill runs with eager attention: every one
        with ``attention = "eager"``, else those that read attention weights
        (:func:`~kvdrift.lm.actions.attention_use.needs_eager`)."""
        chosen = self.only(names)
        if not chosen or attention == "eager":
            return sorted(chosen)
        from kvdrift.lm.actions.attention_use import needs_eager

        return sorted(n for n, p in chosen.items() if needs_eager(p))

    def merged(self, other: UserPresses) -> UserPresses:
        """Both sets of presses; an action name given two different presses is refused."""
        from kvdrift.lm.actions.identity import identity_changes, press_identity

        for name in set(self.presses) & set(other.presses):
            a, b = press_identity(self.presses[name]), press_identity(other.presses[name])
            if a != b:
                raise ValueError(f"action {name!r} is given two different presses ({self.source} "
                                 f"and {other.source}: {identity_changes(a, b)}); one name "
                                 f"per press")
        for name in set(self.families) & set(other.families):
            if self.families[name] is not other.families[name]:
                raise ValueError(f"family {name!r} is given twice ({self.source} and "
                                 f"{other.source}); one name per family")
        source = self.source if self.source == other.source else \
            f"{self.source} and {other.source}"
        return UserPresses({**self.presses, **other.presses},
                           {**self.families, **other.families}, source)

    def family_press(self, family: str, kept: float) -> Any:
        """The press of user family ``family`` keeping the fraction ``kept``, checked."""
        from kvdrift.lm.actions.identity import check_press

        try:
            press = self.families[family](kept)
        except Exception as exc:  # noqa: BLE001 - the user's function: any failure is one line
            raise ValueError(f"family {family!r} ({self.source}) raised {type(exc).__name__} "
                             f"at kept ratio {kept:g}: {_first_line(exc)}") from None
        check_press(press, f"{family} at kept ratio {kept:g}")
        return press


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def check_action_name(name: Any, source: str) -> str:
    """A press's action name: visible text without commas (``--actions`` splits on them)
    that is not already an action kvdrift names or parses (``snapkv-half``, ``knorm:ratio=
    0.5``)."""
    from kvdrift.lm.actions.spec import parse_action

    where = f"PRESSES in {source}"
    if not isinstance(name, str):
        raise ValueError(f"{where}: action names must be strings; got {name!r}")
    checks.text(name, f"an action name in {where}", visible=True,
                rule="visible text without commas or surrounding spaces")
    if "," in name or name != name.strip() or name == "help":
        raise ValueError(f"{where}: action name {name!r} must be visible text without commas "
                         "or surrounding spaces, and not 'help'")
    try:
        action = parse_action(name)
    except ValueError:
        return name
    raise ValueError(f"{where}: {name!r} is already an action kvdrift names "
                     f"({action.kvpress_call() or 'no eviction'}); give your press another name")


def check_family_name(name: Any, source: str) -> str:
    """A user family's name: a word (letters, digits, ``-``, ``_``, ``.``) that is no
    built-in family (``snapkv``, ``kivi``, any press kvdrift names)."""
    from kvdrift.frontier_search.families import parse_family

    where = f"FAMILIES in {source}"
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ValueError(f"{where}: family names must be words (letters, digits, '-', '_', "
                         f"'.'); got {name!r}")
    try:
        parse_family(name)
    except ValueError:
        return name
    raise ValueError(f"{where}: {name!r} is already a family kvdrift names; give your family "
                     "another name")


def checked(presses: Mapping[Any, Any] | None, families: Mapping[Any, Any] | None,
            source: str) -> UserPresses:
    """Check names and values: every press a kvpress press, every family callable."""
    from kvdrift.lm.actions.identity import check_press

    for what, table in (("PRESSES", presses), ("FAMILIES", families)):
        if table is not None and not isinstance(table, Mapping):
            raise ValueError(f"{what} in {source} must be a dict (name -> "
                             f"{'press' if what == 'PRESSES' else 'function of the kept ratio'}"
                             f"); got a {type(table).__name__}")
    out = {}
    for name, press in (presses or {}).items():
        check_action_name(name, source)
        try:
            check_press(press, name)
        except ValueError as exc:
            raise ValueError(f"PRESSES in {source}: {exc}") from None
        out[name] = press
    fams = {}
    for name, make in (families or {}).items():
        check_family_name(name, source)
        if not callable(make):
            raise ValueError(f"FAMILIES in {source}: family {name!r} must be a function of the "
                             f"kept ratio returning a press; got a {type(make).__name__}")
        fams[name] = make
    return UserPresses(out, fams, source)


def _module_name(path: Path) -> str:
    """The name the file's module is registered under: stable for a file's name, so that a
    press class keeps its identity (module and qualified name) wherever the file lies."""
    return "kvdrift_presses_" + re.sub(r"\W", "_", path.stem)


def load_presses_file(path: str | Path) -> UserPresses:
    """Execute the user's presses file and return its checked ``PRESSES`` and ``FAMILIES``.

    The only place a presses file runs, from the bytes read once (module docstring). A
    missing file, an unreadable one (a FIFO or device), one that raises,
    one without ``PRESSES`` or ``FAMILIES``, a value that is not a press, a name that clashes
    with an action or family kvdrift names, or a family that is not callable: one line each.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"presses file {path} does not exist")
    if not path.is_file():
        raise ValueError(f"presses file {path} must be a regular file (a Python file)")
    press_source.forget()  # an earlier file's modules are no module "already loaded" here
    try:
        press_folder.check_folder(path)  # before anything runs (or torch loads)
        data = press_source.read_source(path)
    except press_folder.PressRefused as exc:
        raise ValueError(f"presses file {path}: {exc}") from None
    except (NotARegularFile, OSError) as exc:
        raise ValueError(f"presses file {path} cannot be read: {_first_line(exc)}") from None
    try:
        module = press_source.load(path, _module_name(path), data)
    except press_folder.PressRefused as exc:  # the code it imports, refused as it is found
        raise ValueError(f"presses file {path}: {exc}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's file: one line
        raise ValueError(f"presses file {path} raised {type(exc).__name__}"
                         f"{_where(exc, path)}: {_first_line(exc)}") from None
    presses, families = getattr(module, "PRESSES", None), getattr(module, "FAMILIES", None)
    if presses is None and families is None:
        raise ValueError(f"presses file {path} defines no PRESSES (a dict from action name to a "
                         f"kvpress press object; FAMILIES, for the frontier, is optional)")
    return checked(presses, families, str(path))


def _where(exc: BaseException, path: Path) -> str:
    """`` (line N)`` of the presses file where ``exc`` was raised (its last frame there), or
    `` (helpers.py line N)`` for a module it imported (a syntax error in it, or the last frame
    in code kvdrift ran for it)."""
    filename = getattr(exc, "filename", None) if isinstance(exc, SyntaxError) else None
    line = getattr(exc, "lineno", None) if filename else None
    tb = exc.__traceback__ if not filename else None
    while tb is not None:  # the last frame of the user's code
        if press_source.SOURCE_KEY in tb.tb_frame.f_globals:
            filename, line = tb.tb_frame.f_code.co_filename, tb.tb_lineno
        tb = tb.tb_next
    if not line:
        return ""
    if filename == str(path):
        return f" (line {line})"
    return f" ({Path(filename).name} line {line})"  # a module it imported


def from_actions(actions: Mapping[str, Any] | Sequence[Any] | str
                 ) -> tuple[tuple[str, ...], UserPresses]:
    """Actions as the Python API takes them: a list of spec strings, or a dict from action name
    to a spec string (the same name: ``{"snapkv-half": "snapkv-half"}``) or a press object.
    Returns the action names, in order, and the press objects among them."""
    if isinstance(actions, str):
        from kvdrift.lm.grammar.fields import split_actions

        return tuple(split_actions(actions)), UserPresses()
    if not isinstance(actions, Mapping):
        names = list(actions)
        for a in names:
            if not isinstance(a, str):
                raise ValueError(f"actions: a list takes spec strings; give a press object "
                                 f"under a name in a dict ({{'mine': press}}); got {a!r}")
        return tuple(names), UserPresses()
    presses = {}
    for name, value in actions.items():
        if isinstance(value, str):
            if value.strip() != name:
                raise ValueError(f"actions: a spec string stands under its own name "
                                 f"({{{value!r}: {value!r}}}); got {{{name!r}: {value!r}}}")
            continue
        presses[name] = value
    return tuple(actions), checked(presses, None, FROM_PYTHON)


def recorded_press_actions(out: str | Path) -> list[str]:
    """The press action names a store's ``run.json`` records (none if it has no run.json or
    records none); read as data only, nothing in the store is ever executed."""
    from kvdrift.run.run_file import RUN_FILE, read_run_file

    path = Path(out) / RUN_FILE
    if path.is_symlink() or not path.is_file():  # none yet, or not one kvdrift reads
        return []
    try:
        names = read_run_file(path)["config"].get(RECORDED_KEY, [])
    except (OSError, ValueError):  # damaged: opening the store names it
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def refuse_missing_presses(out: str | Path, actions: Iterable[str],
                           presses: UserPresses | None) -> None:
    """Refuse, in one line, to resume a store whose action was a press object without that
    press given again: kvdrift keeps press names, never the code that made them."""
    given = presses.only(actions) if presses else {}
    recorded = recorded_press_actions(out)
    missing = [a for a in actions if a in recorded and a not in given]
    if missing:
        raise ValueError(f"{out} measured {missing[0]!r} with a press of your own; give its "
                         f"presses file again to resume (--presses FILE, or presses = \"FILE\" "
                         f"in the study TOML; from Python, the press object): kvdrift keeps "
                         f"the press's name and identity, never its code")
