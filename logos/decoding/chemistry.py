"""Incremental SMILES validity for constrained decoding: ring closures, branches, valences, aromatic atoms.

A :class:`SmilesState` follows a SMILES string character by character (tokenizer pieces of several
characters are applied one after another) and refuses, before it is written, any character that
would make the molecule invalid in a way a partial string can already show:

- **rings**: a ring-closure digit opens a ring on the current atom (which must have a free valence)
  or closes it on another atom (not the same one, not one it is already bonded to, with a free
  valence for the bond order); the closing tag is allowed only when no ring is open;
- **valence**: every atom keeps the bond orders it has used (plus explicit and, for bracket atoms,
  stated hydrogens) within the largest valence RDKit's periodic table allows its element (charged
  atoms: the isoelectronic neutral element, RDKit's rule); aromatic atoms also keep at most three
  neighbours (``o`` two), an aromatic bond counting one;
- **completability**: a character that leaves open rings with no atom able to take another bond
  (the current atom and every branch point are full) is refused, so a sample can always be closed;
- **aromatic atoms** must end inside a ring: at the closing tag every aromatic atom lies on a cycle
  of the molecule graph, and no character may leave an aromatic atom that no future ring can pass
  through (:meth:`SmilesState.aromatic_atoms_can_close`);
- **kekulé structures**: a finished aromatic system (no atom of it can gain a bond) must have one, and in an
  unfinished one the atoms that can no longer gain bonds and need a double bond must still pair up over its
  aromatic bonds (:meth:`SmilesState.aromatic_systems_problem`, a necessary condition).

A check costs what the token touches: states are copied on write, the atoms on cycles follow each ring
closure, and the aromatic systems are looked at only where an atom changed since they last passed
(``touched``), finished ones once (``settled``) - the verdicts of checking everything every time.

What a partial string cannot show (a kekulé structure for an aromatic system, some exotic
hypervalences) is checked once on the finished span by RDKit; a span that fails is resampled by
the caller, and the rate is reported.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from logos.decoding.aromatic import covering_matching, cycle_atoms, path_atoms, perfect_matching, unpruned
from logos.decoding.atoms import (AROMATIC, BOND_ORDERS, ORGANIC, SmilesError, Atom, bracket_prefix,  # noqa: F401
                                  BRACKET, CHARGE, allowed_valences)

__all__ = ["SmilesState", "SmilesError"]

OPEN_CHECK = True  # refuse unfinished aromatic systems whose fixed atoms can no longer pair (tests switch it off)

@dataclass(slots=True)  # compact (as its atoms): fewer cache lines to fetch per check in the sampling loop
class SmilesState:
    """Where a SMILES string stands: its atoms, open rings and branches, the bond about to be made."""

    atoms: list[Atom] = field(default_factory=list)
    current: int | None = None
    branches: list[int] = field(default_factory=list)
    rings: dict[str, tuple[int, int | None]] = field(default_factory=dict)  # label -> (atom, bond order)
    bond: int | None = None           # an explicit bond written, waiting for its atom or ring label
    pending: str = ""                 # a bracket atom, a two-letter element or %nn label being read
    label_ok: bool = False            # a ring label may come next (right after its atom or another label)
    bond_aromatic: bool = False       # the pending bond was written ':'
    settled: frozenset[int] = frozenset()  # atoms of finished aromatic systems already matched (they never change)
    owned: set[int] | None = field(default=None, repr=False, compare=False)  # atoms this state may change in place
    cycles: frozenset[int] | None = field(default=frozenset(), repr=False, compare=False)  # atoms on cycles
    # (None: recompute; kept by each ring closure, see _in_cycles)
    empty_branch: bool = False        # a '(' written, no atom in it yet (RDKit refuses '()')
    lonely: tuple[int, ...] = ()      # aromatic atoms on no cycle yet (kept by _add_atom and _ring)
    touched: set[int] = field(default_factory=set, repr=False, compare=False)  # atoms changed (or no longer anchors)
    # since the aromatic systems were last checked: only their systems can have changed (see :meth:`dead_end`)
    bridges: tuple[tuple[int, int], ...] = ()  # aromatic bonds on no cycle yet (kept by _add_atom and _ring):
    # RDKit makes those left at the end single (c1ccccc1c1ccccc1), so a final kekulé structure cannot use them

    def copy(self) -> "SmilesState":
        """A copy that shares the atoms until either side changes one (copy on write: :meth:`_own`), so trying a
        token on a long molecule costs what the token touches, not the molecule's size."""
        self.owned = set()
        return SmilesState(list(self.atoms), self.current, list(self.branches), dict(self.rings), self.bond,
                           self.pending, self.label_ok, self.bond_aromatic, self.settled, set(),
                           self.cycles, self.empty_branch, self.lonely, set(self.touched), self.bridges)

    def _own(self, i: int) -> Atom:
        """Atom ``i``, copied first unless this state already owns it (atoms may be shared with copies)."""
        if self.owned is None:
            self.owned = set(range(len(self.atoms)))  # a fresh state owns all its atoms
        if i not in self.owned:
            self.atoms[i] = self.atoms[i].copy()
            self.owned.add(i)
        self.touched.add(i)
        return self.atoms[i]

    # ------------------------------------------------------------------ characters
    def feed(self, text: str) -> None:
        """Apply ``text``; SmilesError (state unspecified) when it cannot lead to a valid molecule."""
        for ch in text:
            self._char(ch)
        ahead = self
        if self.pending in ("C", "B"):  # C or B (or Cl, Br): the atom must fit either way
            ahead = self.copy()
            ahead.flush()
        if not ahead.pending:
            problem = ahead.dead_end()
            if problem is not None:
                raise SmilesError(problem)
        self.settled = ahead.settled

    def dead_end(self) -> str | None:
        """Why no continuation of this state (no pending characters) can end validly, None if none is seen:
        open rings no atom can close, an aromatic atom no ring can reach, a finished aromatic system without a kekulé
        structure, or an unfinished one whose fixed atoms can no longer be paired (:meth:`aromatic_systems_problem`).

        Aromatic systems are looked at only where they contain a ``touched`` atom: one changed, added or no longer able
        to grow since the checks last passed (a system of unchanged atoms that were anchors before are anchors still
        passes as it did); they pass, ``touched`` is cleared.
        """
        if not self.completable():
            return "no atom left to close the open rings"
        anchors = None
        if self.lonely_aromatic():
            anchors = self._anchors()
            if not self.aromatic_atoms_can_close(anchors):
                return "an aromatic atom can no longer end up in a ring"
        problem = self.aromatic_systems_problem(anchors, OPEN_CHECK)
        if problem is None:
            self.touched = set()
        return problem

    def aromatic_systems_problem(self, anchors: set[int] | None = None, open_check: bool = True) -> str | None:
        """Why an aromatic system with a ``touched`` atom cannot end validly (None: none is seen), each system found
        once:

        - a *finished* system (none of its atoms can gain a bond) needs a kekulé structure: a perfect matching, over
          its aromatic bonds, of the atoms that need a double bond. A finished system never changes, so once matched
          its atoms are ``settled`` and not looked at again;
        - in an *unfinished* one (with ``open_check``), the atoms that can gain no bond keep their bonds, so those
          needing a double bond must pair up over the system's aromatic bonds, with each other or with atoms that can
          still gain bonds (which may also pair with atoms still to come). A necessary condition, so it refuses only
          continuations that cannot end validly.
        """
        atoms, settled = self.atoms, self.settled
        todo = [i for i in self.touched if atoms[i].aromatic and i not in settled]  # (settled systems are finished)
        if not todo:
            return None
        anchors = self._anchors() if anchors is None else anchors
        seen: set[int] = set()
        for start in todo:
            if start in seen:
                continue
            system = self._system(start)
            seen |= system
            if system.isdisjoint(anchors):
                needing = [i for i in system if atoms[i].needs_double()]
                if len(needing) % 2 or (needing and not perfect_matching(atoms, needing)):
                    return "a finished aromatic system cannot be kekulized"
                settled = settled | system
            elif open_check and len(system) >= 3:
                must = [i for i in system if i not in anchors and atoms[i].needs_double()]
                if must and not covering_matching(atoms, must, [i for i in system if i in anchors]):
                    return "an aromatic system being written can no longer be kekulized"
        self.settled = settled
        return None

    def _char(self, ch: str) -> None:
        if self.pending:
            self._pending_char(ch)
        elif ch == "[" or ch == "%":
            need = self.bond if self.bond is not None else 1  # the next atom's bond, or the ring bond
            if (ch == "%" or self.current is not None) and (self.current is None or self.atoms[self.current].free < need):
                raise SmilesError(f"{ch!r} on an atom without a free valence")
            if ch == "%" and not self.label_ok:
                raise SmilesError("a ring label must follow its atom")
            if ch == "[" and self.current is not None:  # whatever atom comes, the current one stops growing
                future = self.copy()
                future._add_atom(Atom(99))
                if not future.aromatic_atoms_can_close() or not future.final_systems_kekulize():
                    raise SmilesError("a next atom would strand an aromatic atom")
            self.pending = ch
        elif ch in "CBNOPSFIcbnops":
            if ch in "CB":  # Cl, Br: wait for the next character
                self.pending = ch
            else:
                self._aliphatic_or_aromatic(ch)
        elif ch == "*":
            self._add_atom(Atom(99))
        elif ch.isdigit():
            self._ring(ch)
        elif ch == "(":
            if self.current is None or self.atoms[self.current].free < 1 or self.bond is not None or self.empty_branch:
                raise SmilesError("branch on an atom without a free valence")
            self.branches.append(self.current)
            self.label_ok, self.empty_branch = False, True
        elif ch == ")":
            if not self.branches or self.bond is not None or self.empty_branch:
                raise SmilesError("unbalanced or empty branch")
            self.touched.add(self.current)  # the branch's last atom stops growing
            self.current = self.branches.pop()
            self.label_ok = False
        elif ch == ".":
            if self.branches or self.bond is not None:
                raise SmilesError("'.' inside a branch or after a bond")
            if self.current is not None:
                self.touched.add(self.current)
            self.current, self.label_ok = None, False
        elif ch in BOND_ORDERS:
            if self.current is None or self.bond is not None:
                raise SmilesError(f"bond {ch!r} without an atom before it")
            if self.atoms[self.current].free < BOND_ORDERS[ch]:
                raise SmilesError(f"bond {ch!r} exceeds a valence")
            self.bond, self.bond_aromatic = BOND_ORDERS[ch], ch == ":"
        elif ch in "<>":  # dative bonds -> and <-: no valence bookkeeping (RDKit checks the finished span)
            if ch == ">" and self.bond is not None:
                self.bond = 0
            elif ch == "<":
                self.bond = None
                self.pending = "<"
        else:
            raise SmilesError(f"unexpected {ch!r}")

    def _pending_char(self, ch: str) -> None:
        p = self.pending
        if p == "<":  # "<-"
            self.pending = ""
            if ch != "-":
                raise SmilesError("'<' not followed by '-'")
            self.bond = 0
        elif p in ("C", "B"):
            self.pending = ""
            if (p, ch) in (("C", "l"), ("B", "r")):
                self._add_atom(Atom(ORGANIC[p + ch]))
            else:
                self._aliphatic_or_aromatic(p)
                self._char(ch)
        elif p.startswith("%"):
            if not ch.isdigit():
                raise SmilesError("'%' needs two digits")
            self.pending += ch
            if len(self.pending) == 3:
                label, self.pending = self.pending, ""
                self._ring(label)
        else:  # inside [...]
            self.pending += ch
            if not bracket_prefix(self.pending):
                raise SmilesError(f"no atom starts with {self.pending!r}")
            if ch != "]" and not self._bracket_can_end(self.pending.split(":")[0]):
                raise SmilesError(f"no valid atom starts with {self.pending!r}")
            if ch == "]":
                atom, self.pending = self.pending, ""
                self._bracket(atom)

    def flush(self) -> None:
        """Resolve a trailing ``C`` or ``B`` (that could still have become Cl or Br)."""
        if self.pending in ("C", "B"):
            p, self.pending = self.pending, ""
            self._aliphatic_or_aromatic(p)

    # ------------------------------------------------------------------ atoms, bonds, rings
    def _aliphatic_or_aromatic(self, ch: str) -> None:
        if ch.islower():
            element, degree = AROMATIC[ch]
            self._add_atom(Atom(ORGANIC[element], aromatic=True, max_degree=degree, valences=allowed_valences(element, 0)))
        else:
            self._add_atom(Atom(ORGANIC[ch], valences=allowed_valences(ch, 0)))

    def _bracket(self, text: str) -> None:
        self._add_atom(_bracket_atom(text).copy())

    def _bracket_can_end(self, head: str) -> bool:
        """Whether the bracket atom begun as ``head`` (no atom map) can still end as a valid, bondable atom: one of
        the atoms its possible endings give (:func:`_bracket_endings`) can bond to the current atom."""
        judged, free = _bracket_endings(head)
        if not judged:
            return True
        if self.current is None:
            return free >= 0 and self.bond is None
        order = self.bond if self.bond is not None else 1
        return free >= order and self.atoms[self.current].free >= order

    def _add_atom(self, atom: Atom) -> None:
        index = len(self.atoms)
        if self.current is not None:
            order = self.bond if self.bond is not None else 1
            prev = self.atoms[self.current]
            if prev.free < order or atom.free < order:
                raise SmilesError("bond exceeds a valence")
            prev = self._own(self.current)
            aromatic = prev.aromatic and atom.aromatic and (self.bond is None or self.bond_aromatic)
            prev.bond(index, order, aromatic)
            atom.bond(self.current, order, aromatic)
            if aromatic:
                self.bridges += ((self.current, index),)
        elif self.bond is not None:
            raise SmilesError("bond without an atom before it")
        self.atoms.append(atom)
        if atom.aromatic:
            self.lonely += (index,)
        self.touched.add(index)
        if self.owned is not None:
            self.owned.add(index)
        self.current, self.bond, self.bond_aromatic, self.label_ok = index, None, False, True
        self.empty_branch = False

    def _ring(self, label: str) -> None:
        if self.current is None or not self.label_ok:
            raise SmilesError("a ring label must follow its atom")
        here = self.atoms[self.current]
        if label not in self.rings:
            order = self.bond if self.bond is not None else 1
            if here.free < order:
                raise SmilesError("ring opening exceeds a valence")
            here = self._own(self.current)
            here.used += order  # reserved for the ring bond (its neighbour is added when it closes)
            here.open_rings += 1
            self.rings[label] = (self.current, self.bond, self.bond_aromatic)
        else:
            other, opened, opened_aromatic = self.rings.pop(label)
            if other == self.current or other in here.neighbours:
                raise SmilesError("ring closure onto the same or an already bonded atom")
            if self.bond is not None and opened is not None and self.bond != opened:
                raise SmilesError("ring closure with two different bond orders")
            order = self.bond if self.bond is not None else (opened if opened is not None else 1)
            reserved = opened if opened is not None else 1
            far = self.atoms[other]
            if here.free < order or far.free < order - reserved:
                raise SmilesError("ring closure exceeds a valence")
            if len(here.neighbours) >= here.max_degree:
                raise SmilesError("ring closure exceeds an aromatic atom's neighbours")
            aromatic = here.aromatic and far.aromatic and (self.bond is None or self.bond_aromatic) and \
                (opened is None or opened_aromatic)
            path = path_atoms(self.atoms, other, self.current) if self.cycles is not None or self.bridges else []
            if self.cycles is not None:  # new cycle atoms: a path between the ends (:meth:`_in_cycles`)
                self.cycles = self.cycles.union(path)
            if self.bridges:  # the bonds of that path are on the new cycle (a bridge between the ends is on every path)
                on_path = {frozenset(pair) for pair in zip(path, path[1:])}
                self.bridges = tuple(b for b in self.bridges if frozenset(b) not in on_path)
            here, far = self._own(self.current), self._own(other)
            here.bond(other, order, aromatic)
            far.bond(self.current, order - reserved, aromatic)
            far.open_rings -= 1
            here.in_ring = far.in_ring = True  # a ring closure is the only move that makes a new cycle
            if self.lonely:
                cycles = self._in_cycles()
                self.lonely = tuple(i for i in self.lonely if i not in cycles and not self.atoms[i].in_ring)
        self.bond, self.bond_aromatic = None, False

    # ------------------------------------------------------------------ ends
    def completable(self) -> bool:
        """Whether some continuation closes every ring (an atom able to take one more bond exists)."""
        if not self.rings and self.bond is None:
            return True
        points = ([self.current] if self.current is not None else []) + self.branches
        need = self.bond if self.bond is not None else 1
        return any(self.atoms[i].free >= need for i in points) if points else False

    def _in_cycles(self) -> set[int]:
        """Atoms on a closed cycle of the molecule graph, kept up to date by each ring closure: closing a ring between
        atoms a and b puts on a cycle exactly the atoms of a shortest a-b path before the closure (each is an end of
        a bridge on it, which the new bond makes part of a cycle, or already on a cycle); computed from scratch
        (Tarjan) only for a state whose cycles were never followed."""
        if self.cycles is None:
            self.cycles = frozenset(cycle_atoms(self.atoms))
        return self.cycles

    def _anchors(self) -> set[int]:
        """Atoms that can still gain a bond: the current atom and branch points with a free valence, ring openers."""
        anchors = {i for i in [self.current, *self.branches] if i is not None and self.atoms[i].free > 0}
        return anchors | {atom for atom, *_ in self.rings.values()}

    def _system(self, start: int) -> set[int]:
        """The aromatic system of atom ``start``: the atoms its aromatic bonds reach."""
        system, stack = {start}, [start]
        atoms = self.atoms
        while stack:
            for j in atoms[stack.pop()].aromatic_bonds:
                if j not in system:
                    system.add(j)
                    stack.append(j)
        return system

    def final_systems_kekulize(self, anchors: set[int] | None = None) -> bool:
        """Whether every *finished* aromatic system has a kekulé structure (:meth:`aromatic_systems_problem`, the
        unfinished ones left unchecked)."""
        return self.aromatic_systems_problem(anchors, open_check=False) is None

    def lonely_aromatic(self) -> list[int]:
        """Aromatic atoms on no cycle yet."""
        return list(self.lonely)

    def aromatic_atoms_can_close(self, anchors: set[int] | None = None) -> bool:
        """Whether every aromatic atom outside a ring can still become part of one.

        A future ring passes through an existing atom only if the atom lies on the path between two
        *anchors*: atoms that can still take a bond (the current atom and branch points with a free
        valence) and atoms whose ring bond is open. Pruning every non-anchor leaf of the molecule graph
        leaves those paths (and the closed rings); an aromatic atom on no cycle that is pruned away, or
        left with a single anchor, is lost. The current atom may still be on a ring of its own if it can take
        two more bonds (``c1...1``, ``c(C1)C1``) or has a ring open and can take one (``COs1`` + ``ccccc1``); with
        room for one, only if an existing neighbour leads to another anchor (``No`` and ``S(=O)(=O)o`` are dead ends: the ``o`` has one bond left and nothing to
        close a ring with).
        """
        lonely = self.lonely_aromatic()
        if not lonely:
            return True
        anchors = self._anchors() if anchors is None else anchors
        atoms, current, through = self.atoms, self.current, False
        if current in lonely:
            atom = atoms[current]
            room, free = atom.max_degree - len(atom.neighbours) - atom.open_rings, atom.free
            if (room >= 2 and free >= 2) or (atom.open_rings and room >= 1 and free >= 1):  # a ring of its own
                lonely = [i for i in lonely if i != current]  # (its open ring closed by a chain from it: COs1ccccc1)
            elif room >= 1 and free >= 1 and not atom.open_rings:  # one more bond: back through a neighbour
                through = True
        if not lonely:
            return True
        if len(anchors) < 2:
            return False
        alive = unpruned(atoms, anchors)
        if not all(i in alive for i in lonely):
            return False
        return not through or any(j in alive for j in atoms[current].neighbours)

    def can_close(self) -> bool:
        """Whether the span may end here: atoms written, no open ring, bond or branch, aromatic atoms in rings."""
        if self.pending in ("C", "B"):  # a trailing C or B is an atom if the span ends here
            ended = self.copy()
            try:
                ended.flush()
            except SmilesError:
                return False
            return ended.can_close()
        if not self.atoms or self.current is None or self.rings or self.bond is not None or self.branches or \
                self.pending:
            return False  # (no current atom after atoms: a '.' waiting for the next molecule)
        aromatic = [i for i, a in enumerate(self.atoms) if a.aromatic]
        if aromatic and not set(aromatic) <= self._in_cycles():
            return False
        ended = self.copy()
        ended.touched.add(self.current)
        if self.bridges:  # RDKit makes an aromatic bond on no ring single: no kekulé structure may use it, and
            for i, j in self.bridges:  # systems settled with one are matched again
                ended._own(i).aromatic_bonds.discard(j)
                ended._own(j).aromatic_bonds.discard(i)
            ended.touched, ended.settled = set(aromatic), frozenset()
        ended.current = None  # at the end no atom gains a bond: every system is finished
        return ended.final_systems_kekulize()

    def lower_bound(self) -> int:
        """Characters any valid ending needs at least (cheap; :meth:`ending` plans one)."""
        return len(self.branches) + len(self.rings) + len(self.pending) + (self.bond is not None)

    def ending(self, limit: int = 48) -> str | None:
        """A short valid ending found greedily (finish a bracket, close a ring, else a branch, else add a carbon),
        or None when none is found within ``limit`` characters (e.g. an aromatic system that can no longer be
        kekulized). Moves are single characters applied in place, so planning costs little."""
        if self.lower_bound() > limit:
            return None
        state, path = self.copy(), ""
        while len(path) <= limit:
            if state.can_close():
                return path
            if state.pending.startswith("["):
                moves = ["]"]
            elif state.pending.startswith("%"):
                moves = list("0123456789")
            else:
                moves = [label for label in state.rings if len(label) == 1] + [")", "C"]
            for move in moves:
                trial = state if move != "C" else state  # single-character moves fail before they change anything
                try:
                    trial._char(move)
                    if move == "C":
                        trial.flush()
                except SmilesError:
                    continue
                path += move
                break
            else:
                return None
        return None


@functools.lru_cache(maxsize=4096)
def _bracket_atom(text: str) -> Atom:
    """The atom a whole bracket atom ``text`` writes, before any bond (SmilesError if none: a bad element, charge or
    hydrogen count). Shared: callers copy it."""
    m = BRACKET.fullmatch(text)
    if not m:
        raise SmilesError(f"bad bracket atom {text!r}")
    symbol, hydrogens, charge_text = m.group(2), m.group(4), m.group(5)
    h = 0 if not hydrogens else int(hydrogens[1:] or 1)
    charge = 0
    for part in CHARGE.findall(charge_text or ""):
        charge += (2 if part in ("++", "--") else int(part[1:] or 1)) * (1 if part[0] == "+" else -1)
    aromatic = symbol[0].islower()
    if symbol == "*":
        valences = (99,)
    elif aromatic:
        if symbol not in AROMATIC:
            raise SmilesError(f"{symbol!r} cannot be aromatic")
        valences = allowed_valences(AROMATIC[symbol][0], charge)
    else:
        valences = allowed_valences(symbol, charge)
    atom = Atom(valences[-1], used=h, aromatic=aromatic, max_degree=AROMATIC[symbol][1] if aromatic else 99,
                 valences=valences)
    if atom.free < 0:
        raise SmilesError(f"{text} has more hydrogens than its valence allows")
    return atom


@functools.lru_cache(maxsize=4096)
def _bracket_endings(head: str) -> tuple[bool, int]:
    """For a bracket atom begun as ``head``: whether an ending a valid atom could still have (a second element letter,
    a charge) completes it, and the largest free valence among the atoms those endings give (-1: none is valid). A
    head that no ending completes yet (an isotope, a chirality class half written) is judged at a later character."""
    heads = [head] + ([head + c for c in "abcdefghiklmnoprstuy"] if re.fullmatch(r"\[\d{0,3}[A-Z]", head) else [])
    charged = any(c in head[2:] for c in "+-")
    endings = ("]",) if charged else ("]", "+]", "-]", "+2]", "-2]", "+3]", "-3]")
    judged, free = False, -1
    for h in heads:
        for ending in endings:
            if BRACKET.fullmatch(h + ending) is None:
                continue
            judged = True
            try:
                free = max(free, _bracket_atom(h + ending).free)
            except SmilesError:
                continue
    return judged, free
