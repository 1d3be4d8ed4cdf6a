"""`rmmjax chat`: the agent on stdin, one line a question; /tell TEXT records a statement, /end
reflects the session, /quit leaves. What an answer earned is kept before it is printed."""

from __future__ import annotations

import sys

from rmmjax.agent import ChatAgent, Reply
from rmmjax.cli import signals


def _print_response(response: Reply) -> None:
  if response.abstained:
    print("(IRIS judged the evidence for this question missing"
          + (": the LLM was asked to say so)" if response.answer is not None else ")"))
  if response.failure == "llm_error":
    print(f"(the LLM failed: {response.error}; the memories it would have been shown:)")
  if response.answer is not None:
    print(response.answer)
    if response.cited:
      print("  cited: " + ", ".join(f"[{i + 1}]" for i in response.cited))
    if response.failure == "malformed":
      print("  (the reply was not a cited answer: it earns no reward)")
    return
  if response.failure == "malformed":
    print(f"(the LLM's reply held no answer: {response.error}; the memories it was shown:)")
  if not response.shown_texts:
    print("(no memories to show yet)")
  for i, text in enumerate(response.shown_texts, 1):
    line = " ".join(text.split())
    print(f"[{i}] {line[:300]}{' [...]' if len(line) > 300 else ''}")


def _kept(agent: ChatAgent, turns_before: int) -> str:
  written = agent.stats["turns_written"] - turns_before
  return f"{written} turns written by this run are in the bank; {agent.kept()}"


def chat_loop(agent: ChatAgent, user: str, lines, has_llm: bool) -> None:
  """Serves each line of `lines` as a question of `user` until /quit or the end."""
  turns_before = agent.stats["turns_written"]
  print(f"chatting as {user}; /tell TEXT tells the agent something, /end ends the session "
        f"(reflection), /quit leaves"
        + ("" if has_llm else "; no LLM: showing the memories that would be handed to one"),
        file=sys.stderr)
  try:
    for line in lines:
      text = line.strip()
      if not text:
        continue
      if text == "/quit":
        break
      if text == "/end":
        try:
          print(agent.end_session(user).describe())
        except ValueError as err:
          print(f"/end: {err}")
        continue
      if text.split(maxsplit=1)[0] == "/tell":
        said = text[len("/tell"):].strip()
        if not said:
          print("/tell: say what, as in /tell my sister lives in Lisbon")
          continue
        agent.tell(user, said)
        print("(noted)", flush=True)
        continue
      if text.startswith("/") and " " not in text:  # a mistyped command is not a question
        print(f"{text}: not a command (/tell TEXT, /end ends the session, /quit leaves)")
        continue
      _print_response(agent.respond(user, text))
      sys.stdout.flush()
  except KeyboardInterrupt:
    agent.close()
    stopped, code = signals.status()
    print(f"\nrmmjax chat: {stopped}; {_kept(agent, turns_before)}; rerun the same command "
          f"to continue", file=sys.stderr)
    raise SystemExit(code) from None
  agent.close()
  stats = agent.stats
  print(f"reranker updates: {stats['updates']}; queries {stats['queries']}, cited "
        f"{stats['cited']} of {stats['shown']} shown, malformed replies {stats['malformed']}, "
        f"invalid citations {stats['invalid_citations']}, LLM errors {stats['llm_errors']}, "
        f"prompts cut to fit {stats['cut_prompts']}"
        + (f", IRIS abstentions {stats['abstained']}" if "abstained" in stats else "")
        + f"; {_kept(agent, turns_before)}")
