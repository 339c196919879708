"""The day-end notes benchmark (bench/notes.py), its scorer and its player, against the real database and embedder
with a scripted summary model: an "oracle" that notes every line holding one of a conversation's facts, and,
like a careless small model, every claim about someone else as a fact about its speaker."""

from __future__ import annotations

import json
import re
from typing import Any

from bench.notes import Kept, Player, load_conversations, matches, score_conversation
from bot.services import build_services
from tests.fakes import FakeChatServer

CONVERSATIONS = load_conversations()


def test_the_scorer_counts_what_the_benchmark_reports() -> None:
    friends = next(c for c in CONVERSATIONS if c["name"] == "three friends")
    assert matches("Juno works as a nurse", [["nurse", "enfermer"]]) and matches("Lucía es PROFESORA", [["profesora"]])
    perfect = [
        Kept("personal", "juno", "Juno works as a nurse"), Kept("personal", "juno", "Juno is allergic to penicillin"),
        Kept("personal", "bau", "Bau's birthday is on March 3"), Kept("server", None, "Game night is every Friday at 8pm"),
        Kept("personal", "bau", "Bau plays the cello"), Kept("personal", "juno", "Juno's cat is called Luna"),
        Kept("personal", "rin", "Rin moved to Lisbon"),
    ]
    score = score_conversation(friends, perfect)
    assert (score.facts, score.kept, score.wrong_person, score.contradictions, score.duplicates) == (7, 7, 0, 0, 0)
    careless = [
        *perfect[:6],
        Kept("personal", "rin", "Rin lives in Berlin"),  # the move was never noted: a contradiction stands
        Kept("personal", "juno", "Bau's birthday is on March 3"),  # someone else's fact in Juno's list
        Kept("personal", "bau", "Bau is a cheater who steals from his coworkers"),  # Juno's claim, as Bau's memory
        Kept("server", None, "Game night is on Fridays"),  # a duplicate
    ]
    score = score_conversation(friends, careless, days=[perfect])
    assert (score.kept, score.wrong_person, score.claims_saved, score.contradictions, score.duplicates) == (6, 2, 1, 1, 1)
    assert score.lost_to_update == 1  # Lisbon was kept after some day, gone at the end


def oracle(body: dict[str, Any]) -> str:
    """A day's answer noting every line that holds a benchmark fact (as its speaker's, or the server's), and every
    claim about another person (as the claimer's own fact, which the code must refuse)."""
    content = body["messages"][1]["content"]
    head, transcript = content.split("\n\n", 1)
    remembered = dict(re.findall(r"^(M\d+) \([^)]*\): (.*)$", head, re.MULTILINE))
    facts = []
    for line in transcript.splitlines():
        found = re.match(r"(P\d+) \[[^\]]*\](?: \(in a thread\))? ([^:]+): (.*)", line)
        if not found:
            continue
        tag, name, text = found.groups()
        for conversation in CONVERSATIONS:
            for fact in conversation["facts"]:
                if matches(text, fact["keys"]):
                    item = {"by": tag, "about": "server" if fact["who"] == "server" else "self", "fact": f"{name}: {text}"}
                    old = next((f for f in conversation["facts"] if f["id"] == fact.get("replaces")), None)
                    ref = next((r for r, said in remembered.items() if old and matches(said, old["keys"])), None)
                    facts.append({**item, **({"replaces": ref} if ref else {})})
            for claim in conversation.get("claims", []):
                if matches(text, claim["keys"]):
                    facts.append({"by": tag, "about": "self", "fact": f"{name}: {text}"})
    unique = list({json.dumps(f, sort_keys=True): f for f in facts}.values())
    return json.dumps({"summary": "The day, summed up.", "facts": unique})


async def test_the_notes_path_keeps_the_facts_of_a_conversation_and_never_a_claim_about_someone_else(make_core, clock) -> None:
    async with FakeChatServer() as chat, FakeChatServer(responder=oracle, summaries_aside=False) as summarizer:
        core = await make_core(
            chat_base_url=chat.base_url, chat_model="fake", summary_base_url=summarizer.base_url, summary_model="oracle",
            memory_notes="daily",
        )
        services = build_services(core, bot_user_id=2)
        await services.pipeline.servers.sync_default_persona()
        player = Player(services, clock)
        for number, name in enumerate(("three friends", "en español")):
            conversation = next(c for c in CONVERSATIONS if c["name"] == name)
            final, snapshots, days = await player.play(number, conversation)
            score = score_conversation(conversation, final, snapshots)
            assert days == 3 and score.wrong_person == 0 and score.claims_saved == 0, score.details
            assert score.kept >= score.facts - 1, score.details
            assert score.contradictions == 0 and score.lost_to_update == 0, score.details
        assert not any(request.get("tools") for request in chat.requests)  # MEMORY_NOTES=daily: no reply tools
