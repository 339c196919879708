"""Checking what the model says a chat day taught: whose fact it is (by the user id of the lines it comes from),
whether it may be kept, and the day's key details. `bot.summaries.notes` reads the day and saves what passes;
the rules are in docs/memory-rules.md ("Day-end notes").
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bot.memory.models import Memory, MemoryList
from bot.memory.relatedness import content_stems, same_subject, subject_score
from bot.summaries.writer import MAX_KEY_DETAILS, RawFact, Written
from bot.third_person import as_fact_of, clauses, first_person, in_third_person, spoken_as_fact, stated

BOT_TAG = "BOT"
TAG = re.compile(r"\b(P\d{1,3}|BOT)\b", re.IGNORECASE)
REF = re.compile(r"\bM(\d{1,3})\b", re.IGNORECASE)
GROUND_MIN = 0.45  # cosine a fact (the speakers' names left out) needs with one of a person's lines or clauses
GROUND_MARGIN = 0.05  # another person's line this close makes a tie, which the model's `by` breaks
MAX_SOURCES = 3
WEEK_DETAIL_MIN = 0.6  # cosine a week's key detail needs with one of its days' checked facts
CORRECTION = re.compile(  # a line that says it changes something the people said before
    r"\b(correction|actually|update[ds]?|moved|instead|any ?more|no longer|switched|changed|corrección|en realidad|"
    r"ya no|me mud[eé]|me he mudado|se cambia|cambiado|cambió|ahora)\b",
    re.IGNORECASE,
)
COPIED_SHARE = 0.75
PLAN = re.compile(  # what makes a copied line a plan or rule of the group rather than small talk: a number, a day, a month
    r"\d|\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday|weekend|january|february|march|april|may|june|july|"
    r"august|september|october|november|december|lunes|martes|miércoles|jueves|viernes|sábado|domingo|enero|febrero|"
    r"marzo|abril|mayo|junio|julio|agosto|septiembre|octubre|noviembre|diciembre|server|servidor|group|grupo)\b",
    re.IGNORECASE,
)
SELF_WORDS = frozenset({"self", "me", "myself", "speaker", "personal", "person", "themselves", "user"})
SERVER_WORDS = frozenset({"server", "group", "community", "channel", "everyone", "guild", "all"})

Embed = Callable[[Sequence[str]], Awaitable[np.ndarray | None]]
"""Unit vectors of texts with the memory embedder, or None when it is unavailable."""


@dataclass(frozen=True)
class Speaker:
    tag: str
    user_id: int
    name: str
    can_manage: bool  # had Manage Server in one of the day's lines: what a correction of a server memory needs
    notable: bool  # privacy none and not blocked: notes may come from (and be about) them


@dataclass
class DayText:
    """A day as the model reads it, and what maps its answer back to people, messages and memories."""

    speakers: dict[str, Speaker]
    rows: list[dict[str, Any]]  # the kept messages, oldest first (the chat log's rows)
    lines: list[str]  # one transcript line per row
    remembered: dict[str, Memory] = field(default_factory=dict)  # "M1" -> memory
    unnamed: list[str] = field(default_factory=list)  # names of people nothing may be written about (privacy, blocks)

    @property
    def preamble(self) -> str:
        """The speakers' legend and the remembered facts, said before the transcript."""
        legend = "; ".join(f"{s.tag} = {s.name}" for s in self.speakers.values())
        parts = [f"Speakers: {legend}; {BOT_TAG} = the bot"]
        if self.remembered:
            owners = {s.user_id: s for s in self.speakers.values()}
            parts.append("Remembered facts:")
            for ref, memory in self.remembered.items():
                owner = owners.get(memory.owner_id or 0) if memory.list == MemoryList.PERSONAL else None
                shown = spoken_as_fact(memory.text, owner.name) if owner is not None else memory.text
                parts.append(f"{ref} ({owner.tag if owner is not None else 'server'}): {shown}")
        return "\n".join(parts)


@dataclass(frozen=True)
class Note:
    speaker: Speaker
    memory_list: MemoryList
    text: str
    replaces: Memory | None
    sources: tuple[tuple[int, int, int], ...]  # (channel, message, author)
    private: bool = False  # said in a private thread: a key detail of that thread's own summary at most, never a memory
    declared_change: bool = False  # its line says it changes something: the update is held to the lower bar


@dataclass
class Checked:
    """What the code kept of the model's facts: notes to save, the day's key details, and what was dropped, why."""

    notes: list[Note] = field(default_factory=list)
    key_details: list[str] = field(default_factory=list)
    dropped: list[tuple[RawFact, str]] = field(default_factory=list)


def _first_name(name: str) -> str:
    words = re.findall(r"[^\W\d_]+", name)
    return words[0] if words else name


def names_in(text: str, name: str) -> bool:
    """Whether `text` names someone called `name` (the whole name, or its first word of three letters or more)."""
    folded = text.casefold()
    candidates = {name.casefold(), _first_name(name).casefold()}
    return any(len(c) >= 3 and re.search(rf"(?<!\w){re.escape(c)}(?!\w)", folded) for c in candidates)


class FactCheck:
    """Keeps the facts of a day's answer whose person, subject and support hold; the rest is dropped with a reason."""

    def __init__(self, embed: Embed, update_min_similarity: float = 0.60) -> None:
        self._embed = embed
        self.update_min_similarity = update_min_similarity

    async def check(self, written: Written, day: DayText) -> Checked:
        """Keep the facts whose speaker, subject and support hold; the rest is dropped with a reason."""
        checked = Checked()
        people_rows = [row for row in day.rows if not row["is_bot"]]
        facts = await self._unmixed(list(written.facts), people_rows, day, checked)
        line_scores = await self._line_scores(facts, people_rows, day) if facts else None
        seen: dict[str, int] = {}
        known = {" ".join(memory.text.casefold().split()) for memory in day.remembered.values()}
        known |= {" ".join(spoken_as_fact(memory.text, s.name).casefold().split())
                  for memory in day.remembered.values() for s in day.speakers.values() if s.user_id == memory.owner_id}
        for index, fact in enumerate(facts):
            scores = line_scores[index] if line_scores is not None else None
            note, why = self._judge(fact, day, people_rows, scores)
            if note is None:
                checked.dropped.append((fact, why))
                continue
            key = " ".join(note.text.casefold().split())
            if key in known:  # small models copy the remembered facts shown to them into the day's facts
                checked.dropped.append((fact, "a remembered fact, unchanged"))
                continue
            if key in seen:  # the same fact twice: keep the one that says what it corrects
                if note.replaces is not None and checked.notes[seen[key]].replaces is None:
                    checked.notes[seen[key]] = note
                checked.dropped.append((fact, "repeated in the same answer"))
                continue
            seen[key] = len(checked.notes)
            checked.notes.append(note)
        await self._corrections(checked, day)
        await self._unnoted_corrections(checked, day)
        checked.key_details = [note.text for note in checked.notes[:MAX_KEY_DETAILS]]
        return checked

    async def _unmixed(
        self, facts: list[RawFact], rows: list[dict[str, Any]], day: DayText, checked: Checked
    ) -> list[RawFact]:
        """Facts that join what two people said ("I moved here and have a birthday on March 3": Rin moved, Bau has the
        birthday) are cut into parts, each going to the author of its closest line (by GROUND_MIN and GROUND_MARGIN, as
        a whole fact does); a part nobody clearly said stays with the fact. The fact keeps the parts of one person: the
        one the model named, if they said a part, else the author of the best-supported part; every other person's
        parts that name them or speak in the first person become a fact of their own, with that person's tag (their
        lines decide, and every check follows, as for any fact; a fragment such as "due to the rain." is dropped):
        Qwen2.5-Coder 1.5B wrote "Lucía arrives late to the meeting, and Inés is training for the Madrid marathon"
        for Pablo. A part of the fact kept that names another speaker of the day is a claim about them: left
        out, with the reason, when the fact's other parts still say something about their person, by name or in the
        first person ("Pablo added three new cats and Inés mentioned another"); otherwise the fact stays whole (and
        names someone else)."""
        split = [[part for part in fact_parts(fact.text) if _without_speaker_text(part, day)] for fact in facts]
        if not rows or not any(len(parts) > 1 for parts in split):
            return facts
        authors = await self._part_authors(split, rows, day)
        if authors is None:
            return facts
        by_user = {s.user_id: s for s in day.speakers.values()}
        result, theirs = [], []
        for index, fact in enumerate(facts):
            parts = authors.get(index)
            if parts is None:
                result.append(fact)
                continue
            said_by = {author for _, author, _ in parts if author is not None}
            claimed = _claimed(fact, day)
            keep = (claimed.user_id if isinstance(claimed, Speaker) and claimed.user_id in said_by else max(
                ((author, score) for _, author, score in parts if author is not None), key=lambda pair: pair[1]
            )[0]) if said_by else None
            for part, author, _ in parts:
                if author in (keep, None):
                    continue
                if author in by_user and _about_its_person(part, by_user[author]):
                    theirs.append(RawFact(by_user[author].tag, fact.about, part))
                else:  # "due to the rain.": a fragment, no fact of its own
                    checked.dropped.append((replace(fact, text=part), "part of a fact said by someone else"))
            kept = [part for part, author, _ in parts if author in (keep, None)]
            owner = by_user.get(keep) if keep is not None else claimed if isinstance(claimed, Speaker) else None
            if owner is not None:
                plain = [part for part in kept if not _names_another(part, owner, day)]
                if not any(_about_its_person(part, owner) for part in plain):
                    plain = []  # what is left says nothing about anyone ("room B4" of "Sam's exam is on May 12, room B4")
                for part in (kept if plain else []):
                    if part not in plain:
                        checked.dropped.append((replace(fact, text=part), "names someone else than the person who said it"))
                kept = plain or kept
            result.append(fact if len(kept) == len(parts) else replace(fact, text=", ".join(kept)))
        return result + theirs

    async def _part_authors(
        self, split: list[list[str]], rows: list[dict[str, Any]], day: DayText
    ) -> dict[int, list[tuple[str, int | None, float]]] | None:
        """For each fact of several parts (by its index): each part, the author of its closest line (None when nobody
        clearly said it: GROUND_MIN and GROUND_MARGIN, as for a whole fact) and that line's score. None without an
        embedder."""
        pieces = [(i, piece) for i, row in enumerate(rows) for piece in clauses(str(row["text"]))]
        wanted = [(index, part) for index, parts in enumerate(split) if len(parts) > 1 for part in parts]
        vectors = await self._embed([piece for _, piece in pieces] + [_without_speaker_text(p, day) for _, p in wanted])
        if vectors is None:
            return None
        by_piece = vectors[len(pieces) :] @ vectors[: len(pieces)].T
        authors: dict[int, list[tuple[str, int | None, float]]] = {}
        for row_number, (index, part) in enumerate(wanted):
            best: dict[int, float] = {}
            for column, (row_index, _) in enumerate(pieces):
                author = rows[row_index]["author_id"]
                best[author] = max(best.get(author, -1.0), float(by_piece[row_number, column]))
            ranked = sorted(best, key=lambda user: -best[user])
            top = ranked[0] if ranked and best[ranked[0]] >= GROUND_MIN else None
            if top is not None and len(ranked) > 1 and best[ranked[1]] >= best[top] - GROUND_MARGIN:
                top = None  # nobody clearly said it
            authors.setdefault(index, []).append((part, top, best.get(top, 0.0) if top is not None else 0.0))
        return authors

    async def _corrections(self, checked: Checked, day: DayText) -> None:
        """A correction the model wrote without its `replaces` ("my cat is actually called Luna" with "Juno's cat is
        called Mochi" remembered): when the line says it changes something (CORRECTION) and one remembered fact of the
        note's list (personal: the speaker's own; server: only for a speaker with Manage Server; never a protected one) is
        about the same subject by the unrelated-update guard's rule, the note replaces the closest such fact. Left alone,
        the old fact would stand beside the new one. A personal note whose lines are not in the first person may also
        correct a server fact (it becomes a server note): the model names the speaker in a change of the group's plans.

        Besides the note's text, its speaker's own first-person lines rewritten as facts about them (`_spoken_lines`)
        are compared: 1.5B wrote "Leo switched mains to tank" for "I switched mains, I play tank now instead of
        healer", which lost the word it shares with "Leo always plays the healer". When only such a line is about the
        same subject, it becomes the note's text, since the update applies its own guard to the text it is given."""
        open_notes = [
            (index, note) for index, note in enumerate(checked.notes)
            if note.replaces is None and any(CORRECTION.search(line) for line in _lines_of(note, day))
        ]
        taken = {note.replaces.id for note in checked.notes if note.replaces is not None}
        if not open_notes or not day.remembered:
            return
        remembered = list(day.remembered.values())
        spoken = [_spoken_lines(note, day) for _, note in open_notes]  # the speaker's own lines, as facts about them
        texts = [note.text for _, note in open_notes] + [line for lines in spoken for line in lines]
        vectors = await self._embed(texts + [m.text for m in remembered])
        line_rows = iter(range(len(open_notes), len(texts)))
        said_rows = [[next(line_rows) for _ in lines] for lines in spoken]
        for row, (index, note) in enumerate(open_notes):
            lists = {note.memory_list}
            if note.memory_list == MemoryList.PERSONAL and not any(first_person(line) for line in _lines_of(note, day)):
                lists.add(MemoryList.SERVER)  # "Lucía changed the meeting to Sunday", from "la quedada se cambia al domingo"
            scored = []
            for column, memory in enumerate(remembered):
                if memory.id in taken or memory.list not in lists or memory.protected:
                    continue  # a guess may not turn a new fact into a refused change: only what the speaker may change
                if memory.list == MemoryList.SERVER and not note.speaker.can_manage:
                    continue
                if memory.list == MemoryList.PERSONAL and memory.owner_id != note.speaker.user_id:
                    continue
                for said_row, said in ((row, note.text), *zip(said_rows[row], spoken[row], strict=True)):
                    cosine = float(vectors[said_row] @ vectors[len(texts) + column]) if vectors is not None else None
                    if same_subject(memory.text, said, cosine, self.update_min_similarity, declared_change=True):
                        scored.append((subject_score(memory.text, said, cosine) or 0.0, memory, said))
            if scored:
                best = max(scored, key=lambda found: found[0])[1]
                texts_for_best = [said for _, memory, said in scored if memory is best]
                text = note.text if note.text in texts_for_best else texts_for_best[0]  # the update checks it again
                checked.notes[index] = replace(note, memory_list=best.list, text=text, replaces=best, declared_change=True)
                taken.add(best.id)

    async def _unnoted_corrections(self, checked: Checked, day: DayText) -> None:
        """A line that corrects a remembered fact of its own speaker, which the model left out of its facts, is noted
        as said (Qwen2.5-Coder 1.5B wrote every line of Juno's day as a fact but "correction: my cat is actually called
        Luna", and put a remembered fact in its place): left alone, the old fact would stand, corrected by nobody.

        The line must say it changes something (CORRECTION), be no question, name no other speaker and nobody who
        asked not to be noted, and speak in the first person (a personal fact: the speaker's own remembered facts) or,
        from a speaker with Manage Server, name a plan of the group (the server's). It replaces the remembered fact of
        that list closest to it by the unrelated-update guard's full rule (no lower bar: "actually I'm so tired after my
        shift" would replace "Juno works as a nurse, night shifts mostly"), never a protected one nor one another note
        already replaces; with none about the same subject, nothing is noted (a "correction" of nothing remembered is
        the model's to write). Its text is the line without an address to the bot and a leading label ("correction:"),
        a personal one written as a fact about its speaker when the rules can (`in_third_person`; then that is what it
        is compared by: "Mia moved to Montreal, ..." scores 0.62 with "Mia lives in Toronto, ...", the line 0.45).
        A "Name: " put in front would be compared by a name alone ("Juno: actually I'm so tired after my shift" scores
        0.63 with the nurse fact, the line 0.37), so the line itself is."""
        if not day.remembered:
            return
        noted = {(channel, message) for note in checked.notes for channel, message, _ in note.sources}
        taken = {note.replaces.id for note in checked.notes if note.replaces is not None}
        by_user = {s.user_id: s for s in day.speakers.values()}
        found: list[tuple[dict[str, Any], Speaker, MemoryList, str, str]] = []  # ..., the note's text, what is compared
        for row in day.rows:
            speaker = by_user.get(row["author_id"])
            if row["is_bot"] or speaker is None or not speaker.notable or (row["channel_id"], row["message_id"]) in noted:
                continue
            said = stated(str(row["text"]))
            if not said or not CORRECTION.search(str(row["text"])) or said.rstrip().endswith("?"):
                continue
            others = [s.name for s in day.speakers.values() if s.user_id != speaker.user_id] + day.unnamed
            if any(names_in(said, name) and not names_in(speaker.name, name) for name in others):
                continue
            if first_person(said):
                rewritten = None if names_in(said, speaker.name) else in_third_person(said, speaker.name)
                text = rewritten or (said if names_in(said, speaker.name) else f"{speaker.name}: {said}")
                found.append((row, speaker, MemoryList.PERSONAL, text, rewritten or said))
            elif speaker.can_manage and PLAN.search(said):
                found.append((row, speaker, MemoryList.SERVER, said, said))
        if not found:
            return
        remembered = list(day.remembered.values())
        vectors = await self._embed([compared for *_, compared in found] + [m.text for m in remembered])
        for row_number, (row, speaker, memory_list, said, compared) in enumerate(found):
            scored = []
            for column, memory in enumerate(remembered):
                if memory.id in taken or memory.list != memory_list or memory.protected:
                    continue
                if memory_list == MemoryList.PERSONAL and memory.owner_id != speaker.user_id:
                    continue
                cosine = float(vectors[row_number] @ vectors[len(found) + column]) if vectors is not None else None
                if same_subject(memory.text, compared, cosine, self.update_min_similarity):  # the full bar (docstring)
                    scored.append((subject_score(memory.text, compared, cosine) or 0.0, memory))
            if not scored:
                continue
            best = max(scored, key=lambda pair: pair[0])[1]
            source = ((row["channel_id"], row["message_id"], row["author_id"]),)
            checked.notes.append(Note(speaker, memory_list, said, best, source, bool(row.get("private_thread"))))
            taken.add(best.id)

    async def _line_scores(self, facts: list[RawFact], rows: list[dict[str, Any]], day: DayText) -> np.ndarray | None:
        """How well each of the people's lines supports each fact (facts x lines): the best cosine between the fact,
        its speaker's name left out ("Juno's cat is called Mochi" -> "cat is called Mochi", closer to "my cat is
        called Mochi"), and the line or one of its clauses. None without an embedder."""
        pieces = [(i, piece) for i, row in enumerate(rows) for piece in clauses(str(row["text"]))]
        stripped = [_without_speaker(fact, day) for fact in facts]
        vectors = await self._embed([piece for _, piece in pieces] + stripped)
        if vectors is None:
            return None
        by_piece = vectors[len(pieces) :] @ vectors[: len(pieces)].T
        scores = np.full((len(facts), len(rows)), -1.0)
        for column, (row_index, _) in enumerate(pieces):
            scores[:, row_index] = np.maximum(scores[:, row_index], by_piece[:, column])
        return scores

    def _judge(
        self, fact: RawFact, day: DayText, rows: list[dict[str, Any]], scores: np.ndarray | None
    ) -> tuple[Note | None, str]:
        """Whose fact it is (the author of the lines it comes from, by id), and whether it may be kept."""
        claimed = _claimed(fact, day)
        if claimed == BOT_TAG:
            return None, "the bot's words are never a source"
        speaker, sources = _source(fact, day, rows, scores, claimed if isinstance(claimed, Speaker) else None)
        if speaker is None:
            return None, "not supported by one person's own lines"
        fact = replace(fact, text=_tags_named(fact.text, day, speaker))
        others = [s for s in day.speakers.values() if s.user_id != speaker.user_id]
        if any(names_in(fact.text, s.name) and not names_in(speaker.name, s.name) for s in others):
            return None, "names someone else than the person who said it"
        if any(names_in(fact.text, name) and not names_in(speaker.name, name) for name in day.unnamed):
            return None, "names someone who asked not to be noted (privacy or block)"
        line = next((str(r["text"]) for r in rows if (r["channel_id"], r["message_id"]) == sources[0][:2]), "")
        small_talk = _small_talk(fact, speaker, line)
        if small_talk:
            return None, small_talk
        memory_list = _list_of(fact, speaker, line)
        if memory_list is None:
            return None, "about someone else"
        named = memory_list == MemoryList.SERVER or names_in(fact.text, speaker.name)
        text = spoken_as_fact(fact.text, speaker.name) if named else as_fact_of(fact.text, speaker.name)
        said = {(channel, message) for channel, message, _ in sources}
        private = any(row.get("private_thread") for row in rows if (row["channel_id"], row["message_id"]) in said)
        return Note(speaker, memory_list, text, _replaced(fact, speaker, memory_list, day), sources, private), ""

    async def week_details(self, proposed: Sequence[str], checked: Sequence[str]) -> list[str]:
        """A week's key details: only those that restate a checked fact of its days (the model may not add claims
        there that the days' checks dropped). Closest by the embedding model, or by a shared word without one."""
        if not proposed or not checked:
            return []
        vectors = await self._embed([*proposed, *checked])
        kept = []
        for index, detail in enumerate(proposed):
            if vectors is None:
                supported = any(content_stems(detail) & content_stems(fact) for fact in checked)
            else:
                supported = float(max(vectors[len(proposed) :] @ vectors[index])) >= WEEK_DETAIL_MIN
            if supported:
                kept.append(detail)
        return kept[:MAX_KEY_DETAILS]


def _claimed(fact: RawFact, day: DayText) -> Speaker | str | None:
    """Who the model says said it: a speaker tag (BOT for the bot), or else one speaker's name. Only a hint:
    the lines the fact comes from decide (`_source`)."""
    found = TAG.search(fact.by)
    if found is not None:
        tag = found.group(1).upper()
        return BOT_TAG if tag == BOT_TAG else day.speakers.get(tag)
    named = [s for s in day.speakers.values() if names_in(fact.by, s.name)]
    return named[0] if len(named) == 1 else None

def _list_of(fact: RawFact, speaker: Speaker, line: str) -> MemoryList | None:
    """Which list a fact goes to, decided mostly by what the person said: a line in the first person singular
    (I, my, soy, tengo...) makes a personal fact; otherwise `about` says, and a "self" fact must name its
    speaker ("Kai is vegetarian"), or it is taken for a server fact (a model wrote "I'm planning a game night"
    for "game night is every Friday on this server"). `about` naming anyone else: nothing."""
    about = fact.about.strip().casefold()
    is_self = about in SELF_WORDS or about == speaker.tag.casefold() or names_in(about, speaker.name)
    if not (is_self or about in SERVER_WORDS):
        return None
    if first_person(line) or (is_self and names_in(fact.text, speaker.name)):
        return MemoryList.PERSONAL
    return MemoryList.SERVER

def _source(
    fact: RawFact, day: DayText, rows: list[dict[str, Any]], scores: np.ndarray | None, claimed: Speaker | None
) -> tuple[Speaker | None, tuple[tuple[int, int, int], ...]]:
    """The person whose own lines the fact comes from, and those lines (at most three), or (None, ()).

    The closest line (cosine of the fact, names left out, with each line and clause) must reach GROUND_MIN and
    belong to one person: when another person's line comes within GROUND_MARGIN, the model's `by` decides
    between them, or nobody does. Without an embedder, the claimed speaker's lines sharing a content word."""
    by_user = {s.user_id: s for s in day.speakers.values()}
    if scores is None:
        if claimed is None:
            return None, ()
        stems = content_stems(fact.text)
        own = [i for i, row in enumerate(rows) if row["author_id"] == claimed.user_id and stems & content_stems(row["text"])]
        return (claimed, _sources(rows, own)) if own else (None, ())
    best: dict[int, float] = {}
    for i, row in enumerate(rows):
        best[row["author_id"]] = max(best.get(row["author_id"], -1.0), float(scores[i]))
    ranked = sorted(best, key=lambda user: -best[user])
    if not ranked or best[ranked[0]] < GROUND_MIN:
        return None, ()
    close = [user for user in ranked if best[user] >= best[ranked[0]] - GROUND_MARGIN]
    if len(close) > 1:
        if claimed is None or claimed.user_id not in close:
            return None, ()
        close = [claimed.user_id]
    speaker = by_user.get(close[0])
    if speaker is None:
        return None, ()
    own = sorted((i for i, row in enumerate(rows) if row["author_id"] == speaker.user_id), key=lambda i: -float(scores[i]))
    return speaker, _sources(rows, [i for i in own if float(scores[i]) >= GROUND_MIN])

def _replaced(fact: RawFact, speaker: Speaker, memory_list: MemoryList, day: DayText) -> Memory | None:
    """The remembered memory the fact corrects: one shown to the model, of the same list (personal: the speaker's)."""
    found = REF.search(fact.replaces or "")
    memory = day.remembered.get(f"M{int(found.group(1))}") if found else None
    if memory is None or memory.list != memory_list:
        return None
    if memory_list == MemoryList.PERSONAL and memory.owner_id != speaker.user_id:
        return None
    return memory


def _small_talk(fact: RawFact, speaker: Speaker, line: str) -> str:
    """Why a fact is no fact, or "": small models copy the day's lines into facts, questions and chit-chat included
    ("Bau: yes, looks great"). A question is kept only when it also tells something in the first person ("my
    birthday is March 3, will you remember?"); a copied line (COPIED_SHARE of the fact's words, the speaker's name
    aside, are the line's: "Rin thanks! la ciudad es preciosa" for "gracias! la ciudad es preciosa") is kept only
    when it speaks in the first person ("I moved to Lisbon"), is about the server, or names a number, a day, a month, the
    group or the server (PLAN: "the group exam is on May 12, room B4" is a plan, whatever `about` the model wrote)."""
    said = _without_prefix(fact.text, speaker)
    if said.rstrip().endswith("?") and not first_person(said):
        return "a question, not a fact"
    if _ASKED.match(_without_name(said, speaker)):  # "Bau asks about the game night schedule." (1.5B's note)
        return "a question, not a fact"
    names = set(_words(f"{speaker.name} {speaker.tag}"))
    own = [word for word in _words(said) if word not in names]
    heard = set(_words(line))
    copied = bool(own) and sum(word in heard for word in own) >= COPIED_SHARE * len(own)
    if not first_person(line) and fact.about.strip().casefold() not in SERVER_WORDS and not PLAN.search(line):
        if copied:
            return "small talk copied from a line, not a fact"
        return "a line not about its speaker (no first person) and no plan of the group"
    return ""


_ASKED = re.compile(
    r"\s*(?:asks?|asked|is asking|was asking|wants to know|wanted to know|inquires|inquired|wonders|wondered|"
    r"pregunta|preguntó|quiere saber)\b",
    re.IGNORECASE,
)


def _without_name(text: str, speaker: Speaker) -> str:
    """A fact without the speaker's name in front ("Bau asks about …" → "asks about …")."""
    for name in sorted({speaker.name, _first_name(speaker.name), speaker.tag}, key=len, reverse=True):
        if name and text.casefold().startswith(name.casefold()):
            return text[len(name):]
    return text


def _without_prefix(text: str, speaker: Speaker) -> str:
    """A fact without the "Name:" a model puts before a copied line."""
    for name in {speaker.name, _first_name(speaker.name), speaker.tag}:
        text = re.sub(rf"^\s*{re.escape(name)}\s*:\s*", "", text, flags=re.IGNORECASE)
    return text


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def _tags_named(text: str, day: DayText, speaker: Speaker) -> str:
    """A fact with the day's speaker tags written as names: small models copy the tags ("P1 worked as a nurse"). A tag
    that opens the fact stands for the person whose lines it comes from, whatever the tag (Qwen2.5-Coder 0.5B wrote
    "P3 is allergic to penicillin" for Juno's P1): the lines decide. Any other tag is that speaker's name."""
    opener = TAG.match(text.lstrip())
    if opener is not None and opener.group(1).upper() != BOT_TAG:
        text = speaker.name + text.lstrip()[opener.end() :]
    return TAG.sub(lambda found: day.speakers[found.group(1).upper()].name if found.group(1).upper() in day.speakers
                   else found.group(0), text)


def _about_its_person(part: str, speaker: Speaker) -> bool:
    """Whether a part of a fact says something about a person on its own: it names them, or speaks in the first person."""
    return names_in(part, speaker.name) or first_person(part)


def _names_another(text: str, speaker: Speaker, day: DayText) -> bool:
    return any(names_in(text, s.name) and not names_in(speaker.name, s.name) for s in day.speakers.values() if s != speaker)


def _spoken_lines(note: Note, day: DayText) -> list[str]:
    """A personal note's first-person source lines as facts about its speaker ("I switched mains, I play tank now
    instead of healer" -> "Leo switched mains, they play tank now instead of healer"): what a remembered fact is
    compared with besides the model's text, which may have lost the word both share ("Leo switched mains to tank")."""
    if note.memory_list != MemoryList.PERSONAL:
        return []
    rewritten = (in_third_person(stated(line), note.speaker.name) for line in _lines_of(note, day))
    return [text for text in rewritten if text is not None]  # never "Leo: ...": a name alone raises the cosine


def _lines_of(note: Note, day: DayText) -> list[str]:
    said = {(channel, message) for channel, message, _ in note.sources}
    return [str(row["text"]) for row in day.rows if (row["channel_id"], row["message_id"]) in said]


def _sources(rows: list[dict[str, Any]], chosen: list[int]) -> tuple[tuple[int, int, int], ...]:
    return tuple((rows[i]["channel_id"], rows[i]["message_id"], rows[i]["author_id"]) for i in chosen[:MAX_SOURCES])


FACT_BREAK = re.compile(r"[;,]?\s+(?:and|but|y|pero)\s+|[;,]\s+", re.IGNORECASE)


def fact_parts(text: str) -> list[str]:
    """A fact's parts, split where it joins two statements ("I moved here and have a birthday on March 3")."""
    return [part for part in (" ".join(p.split()) for p in FACT_BREAK.split(text)) if part]


def _without_speaker_text(text: str, day: DayText) -> str:
    stripped = text
    for speaker in day.speakers.values():
        for name in {speaker.name, _first_name(speaker.name)}:
            if len(name) >= 2:
                stripped = re.sub(rf"(?<!\w){re.escape(name)}(?:'s|’s)?(?!\w)", " ", stripped, flags=re.IGNORECASE)
    stripped = re.sub(r"^[\s:]+", "", stripped)
    return " ".join(stripped.split())


def _without_speaker(fact: RawFact, day: DayText) -> str:
    """The fact without the day's speakers' names: what is left is what someone said about themselves ("Juno's cat
    is called Mochi" -> "cat is called Mochi", closer to "my cat is called Mochi")."""
    stripped = fact.text
    for speaker in day.speakers.values():
        for name in {speaker.name, _first_name(speaker.name)}:
            if len(name) >= 2:
                stripped = re.sub(rf"(?<!\w){re.escape(name)}(?:'s|’s)?(?!\w)", " ", stripped, flags=re.IGNORECASE)
    return " ".join(stripped.split()) or fact.text
