"""How the dlq commands print: rich tables for people, JSON documents (or JSON lines) for scripts.

Each table gives way to one block per row where it does not fit the width (stream/layout.py): keys, reasons
and coordinates are never cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from rich.console import Group, JustifyMethod, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rollout_stream.codec import DecodeError, Sample
from rollout_stream.codec.chunks import CHUNK_HEADER
from rollout_stream.codec.reasons import DeadLetterReason
from rollout_stream.layout import Fit, Flow, titled
from rollout_stream.ops.dlq.inspect import RolloutRewards, hexdump, sample_fields
from rollout_stream.ops.dlq.lineage import ReplayAction
from rollout_stream.ops.dlq.record import DeadLetterRecord, SampleHead, iso_ms
from rollout_stream.ops.dlq.replay import ReplayReport
from rollout_stream.ops.dlq.values import DeadLetterValue

__all__ = [
    "json_line",
    "list_view",
    "stats_view",
    "show_document",
    "show_view",
    "replay_document",
    "replay_view",
]

_json = msgspec.json.Encoder()


def json_line(doc: Any) -> str:
    return _json.encode(doc).decode()


def _short(text: str | None, limit: int = 70) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


# Below this many columns for the message, `dlq list` shows one block per record instead of a table.
_MIN_MESSAGE = 24


def list_view(rows: Sequence[dict[str, Any]], width: int = 120) -> RenderableType:
    """`dlq list`: one line per record (`DeadLetterRecord.summary()`), the message cut to fit `width`; one
    block per record, the message in full, where the other columns leave it less than a few words."""
    names = ["p:offset", "dead-lettered (UTC)", "reason", "group", "rollout", "sib", "replays", "message"]
    cells = [
        [
            f"{r['partition']}:{r['offset']}",
            r["dead_lettered_at"][:19].replace("T", " "),
            r["reason"],
            _cell(r["group_key"]),
            _cell(r["rollout"]),
            _cell(r["sibling_index"]),
            str(r["replay_count"]),
            _message(r),
        ]
        for r in rows
    ]
    if not any(r["replay_count"] for r in rows):  # the usual case: no column of zeros
        names.pop(6)
        for c in cells:
            c.pop(6)
    widths = [max([len(name), *(len(c[i]) for c in cells)]) for i, name in enumerate(names)]
    # Box drawing takes 3 characters per column plus 1; the message gets what is left.
    room = width - sum(widths[:-1]) - 3 * len(names) - 1
    if room < min(_MIN_MESSAGE, widths[-1]):
        return Group(*(_list_block(r) for r in rows))
    table = Table()
    for name in names:
        table.add_column(
            name,
            no_wrap=True,
            justify="right" if name in ("p:offset", "rollout", "sib", "replays") else "left",
        )
    for c in cells:
        c[-1] = _short(c[-1], room)
        table.add_row(*(escape(x) for x in c))
    return table


def _message(r: dict[str, Any]) -> str:
    """The row's message; a chunked value's says first how many of its chunks are there."""
    message = (r["message"] or "").replace("\n", " ")
    chunks = r.get("chunks")
    if chunks is None:
        return message
    state = "" if chunks["problem"] is None else f": {chunks['problem']}"
    return f"[chunked value, {chunks['count']} chunks{state}] {message}"


def _list_block(r: dict[str, Any]) -> RenderableType:
    head = Text.assemble((f"{r['partition']}:{r['offset']}", "bold"), "  ", r["reason"])
    if r["group_key"] is not None:
        head.append(f"  group {r['group_key']}")
    facts = [f"dead-lettered {r['dead_lettered_at'][:19].replace('T', ' ')} UTC"]
    if r["rollout"] is not None:
        facts.append(f"rollout {r['rollout']}")
    if r["sibling_index"] is not None:
        facts.append(f"sibling {r['sibling_index']}")
    if r["replay_count"]:
        facts.append(f"replay count {r['replay_count']}")
    message = _message(r)
    return Group(
        Flow(head, indent=4),
        Flow(", ".join(facts), first=4, indent=4),
        *([Flow(message, first=4, indent=4)] if message else []),
    )


def stats_view(doc: dict[str, Any]) -> RenderableType:
    """`dlq stats`: reasons, time span, top groups and partitions of a `DeadLetterStats.to_dict()`."""
    parts: list[RenderableType] = []
    head = Text.assemble((f"{doc['topic']}", "bold"), f": {doc['matched']} dead-letter records")
    chunked = doc.get("chunk_records", 0)
    if chunked:
        head.append(f" ({doc['values']} values: {doc['chunked_values']} chunked values in {chunked} chunk "
                    "records)")
    if doc["scanned"] != doc["matched"]:
        head.append(f" match the filters ({doc['scanned']} scanned)")
    parts.append(Flow(head, indent=4))
    unit = "values" if chunked else "records"
    if doc["matched"]:
        for which in ("oldest", "newest"):
            r = doc[which]
            line = f"{which} {r['dead_lettered_at']}  {r['partition']}:{r['offset']}  {r['reason']}"
            parts.append(Flow(line, indent=4))
    reasons = Table()
    reasons.add_column("reason")
    reasons.add_column(unit, justify="right")
    reasons.add_column("share", justify="right")
    lines = []
    for reason, n in doc["by_reason"].items():
        share = f"{100 * n / max(doc['values'] if chunked else doc['matched'], 1):.1f}%"
        reasons.add_row(reason, str(n), share)
        lines.append(Flow(f"{reason}: {n} {unit}, {share}", first=2, indent=4))
    parts.append(titled("by reason", Fit(reasons, Group(*lines))))
    exact = (
        ""
        if doc["top_groups_exact"]
        else f" (approximate: counts may be up to {doc['top_groups_max_undercount']} low)"
    )
    distinct = f", {doc['distinct_groups']} groups in all" if doc["distinct_groups"] is not None else ""
    groups = Table()
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("group", "left"),
        (unit, "right"),
        ("reasons", "left"),
        ("first failure", "left"),
    )
    for name, justify in columns:
        groups.add_column(name, justify=justify, no_wrap=True)
    blocks: list[RenderableType] = []
    for g in doc["top_groups"]:
        groups.add_row(
            escape(g["group_key"]), str(g["records"]), ", ".join(g["reasons"]), g["first_failed_at"]
        )
        blocks.append(
            Flow(
                f"{g['group_key']}: {g['records']} {unit}, first failure {g['first_failed_at']}; "
                f"{', '.join(g['reasons'])}",
                first=2,
                indent=4,
            )
        )
    parts.append(titled(f"top groups{distinct}{exact}", Fit(groups, Group(*blocks))))
    if len(doc["by_original_topic"]) > 1:
        topics = Table()
        topics.add_column("topic", no_wrap=True)
        topics.add_column(unit, justify="right")
        per_topic = []
        for t, n in doc["by_original_topic"].items():
            topics.add_row(escape(t), str(n))
            per_topic.append(Flow(f"{t}: {n} {unit}", first=2, indent=4))
        parts.append(titled("by original topic", Fit(topics, Group(*per_topic))))
    parts_table = Table()
    names = ("partition", "log start", "end", "scanned from", "matched", "first matched", "last matched")
    for name in names:
        parts_table.add_column(name, justify="right", no_wrap=True)
    per_partition = []
    for p in doc["partitions"]:
        parts_table.add_row(
            str(p["partition"]),
            str(p["low"]),
            str(p["end"]),
            str(p["scanned_from"]),
            str(p["matched"]),
            _cell(p["first_matched_offset"]),
            _cell(p["last_matched_offset"]),
        )
        matched = (
            f"{p['matched']} matched, offsets {p['first_matched_offset']}–{p['last_matched_offset']}"
            if p["matched"]
            else "none matched"
        )
        per_partition.append(
            Flow(
                f"partition {p['partition']}: log start {p['low']}, end {p['end']}, scanned from "
                f"{p['scanned_from']}; {matched}",
                first=2,
                indent=4,
            )
        )
    parts.append(
        titled("partitions (offsets: log start, end at scan start)", Fit(parts_table, Group(*per_partition)))
    )
    if doc["replayed_before"]:
        again = f"{doc['replayed_before']} of these failed again after a replay (x-replay-count set)"
        parts.append(Flow(again, indent=4))
    return Group(*parts)


def _array_text(value: Any) -> str:
    if isinstance(value, dict) and "dtype" in value:
        more = "…" if value["length"] > len(value["head"]) else ""
        return f"{value['dtype']}[{value['length']}] {', '.join(map(str, value['head']))}{more}"
    return str(value)


def show_document(
    record: DeadLetterRecord,
    decoded: Sample | DecodeError | None,
    members: list[tuple[DeadLetterRecord, SampleHead | None]],
    rewards: list[RolloutRewards] | None,
    value: DeadLetterValue | None = None,
) -> dict[str, Any]:
    """`dlq show --json`: every header, the decoded sample or a hex preview, group members nearby; for a
    chunked value, its chunks (`decoded` None: they do not make the value up)."""
    doc: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "dead_lettered_at": iso_ms(record.timestamp_ms),
        "first_failed_at": iso_ms(record.failed_at_ms),
        "replay_count": record.replay_count,
        "reason": record.reason,
        "message": record.message,
        "group_key": record.group,
        "key": record.key_text,
        "value_bytes": len(record.value) if record.value is not None else None,
        "headers": [[k, _header_text(record, k, v)] for k, v in record.headers],
    }
    chunks = value.chunk_summary() if value is not None else None
    if chunks is not None:
        doc["value_bytes"] = chunks["total_bytes"]
        doc["chunks"] = chunks
    prompt = _exhausted_prompt(record, value)
    if prompt is not None:
        doc["prompt"] = prompt
    elif isinstance(decoded, DecodeError):
        doc["decode_error"] = decoded.message
        doc["hex_preview"] = hexdump((value.value if value is not None else None) or record.value or b"")
    elif decoded is not None:
        doc["sample"] = dict(sample_fields(decoded))
    doc["group_members"] = [
        {
            "partition": r.partition,
            "offset": r.offset,
            "rollout": h.rollout if h else None,
            "sibling_index": h.sibling_index if h else None,
            "sibling_count": h.sibling_count if h else None,
            "reward": h.reward if h else None,
        }
        for r, h in members
    ]
    if rewards is not None:
        doc["sibling_rewards"] = [
            {
                "rollout": r.rollout,
                "sibling_count": r.sibling_count,
                "consistent": r.consistent,
                "rewards": [{"sibling_index": i, "reward": v, "at": at} for i, v, at in r.rewards],
            }
            for r in rewards
        ]
    return doc


def _exhausted_prompt(record: DeadLetterRecord, value: DeadLetterValue | None) -> dict[str, Any] | None:
    """An exhausted prompt's record is not a sample: its value is the prompt and its attempts, as JSON (a
    prompt source writes it, docs/loop.md), shown as such with its times in ISO-8601."""
    if record.reason != DeadLetterReason.PROMPT_ATTEMPTS_EXHAUSTED.value:
        return None
    raw = (value.value if value is not None else None) or record.value
    try:
        doc = msgspec.json.decode(raw or b"")
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("attempts"), list):
        return None
    for attempt in doc["attempts"]:
        if isinstance(attempt, dict):
            for name in ("taken_ms", "ended_ms"):
                if isinstance(attempt.get(name), int):
                    attempt[name.removesuffix("_ms") + "_at"] = iso_ms(attempt.pop(name))
    return doc


def _header_text(record: DeadLetterRecord, name: str, value: bytes) -> str:
    """A header's value as text; the chunk header is binary, so it is said in words."""
    chunk = record.chunk
    if name == CHUNK_HEADER and chunk is not None:
        return (f"chunk {chunk.index} of {chunk.count}, value of {chunk.total_bytes} bytes, "
                f"digest {chunk.digest.hex()}")
    return value.decode("utf-8", "backslashreplace")


def _prompt_view(prompt: dict[str, Any]) -> RenderableType:
    where = (f"prompt {prompt.get('source')}@{prompt.get('epoch')}/{prompt.get('prompt')}: "
             f"{prompt.get('state')}")
    attempts = Table()
    for name in ("attempt", "producer", "taken at", "ended", "ended at", "error"):
        attempts.add_column(name, overflow="fold", no_wrap=name in ("attempt", "taken at", "ended at"))
    for a in prompt["attempts"]:
        if isinstance(a, dict):
            attempts.add_row(str(a.get("attempt")), escape(str(a.get("producer"))),
                             str(a.get("taken_at", "")), str(a.get("ended") or ""),
                             str(a.get("ended_at", "")), escape(a.get("error") or ""))
    return Group(Flow(where, indent=4), titled("attempts", attempts))


def _chunks_line(chunks: dict[str, Any]) -> str:
    offsets = ", ".join(map(str, chunks["offsets"]))
    state = chunks["problem"] or "whole"
    return (f"chunked value of {chunks['total_bytes']} bytes in {chunks['count']} chunks, records at offsets "
            f"{offsets}: {state}")


def show_view(doc: dict[str, Any]) -> RenderableType:
    head = Text.assemble((f"{doc['topic']} {doc['partition']}:{doc['offset']}", "bold"), "  ")
    head.append(doc["reason"], "bold red")
    head.append(f"  group {doc['group_key']}")
    parts: list[RenderableType] = [Flow(head, indent=4), Flow(doc["message"] or "", indent=4)]
    headers = Table(show_header=False)
    headers.add_column("name", style="cyan", no_wrap=True)
    headers.add_column("value", overflow="fold")
    for k, v in doc["headers"]:
        headers.add_row(escape(k), escape(v))
    parts.append(titled("headers", headers))
    if "chunks" in doc:
        style = "yellow" if doc["chunks"]["problem"] else ""
        parts.append(Flow(_chunks_line(doc["chunks"]), indent=4, style=style))
    if "sample" in doc:
        fields = Table(show_header=False)
        fields.add_column("field", style="cyan", no_wrap=True)
        fields.add_column("value", overflow="fold")
        for k, v in doc["sample"].items():
            fields.add_row(k, escape(_array_text(v)))
        parts.append(titled("decoded sample", fields))
    elif "prompt" in doc:
        parts.append(_prompt_view(doc["prompt"]))
    elif "decode_error" in doc:
        parts.append(Flow(f"does not decode: {doc['decode_error']}", indent=4, style="yellow"))
        parts.append(Text(f"{doc['value_bytes'] or 0} bytes:\n" + "\n".join(doc["hex_preview"])))
    if doc.get("sibling_rewards"):
        rewards = Table()
        rewards.add_column("rollout", justify="right", no_wrap=True)
        rewards.add_column("siblings", justify="right", no_wrap=True)
        rewards.add_column("reward of each sibling (by sibling_index)", no_wrap=True)
        rewards.add_column("", no_wrap=True)
        blocks: list[RenderableType] = []
        for r in doc["sibling_rewards"]:
            cells = "   ".join(f"s{x['sibling_index']}={x['reward']}" for x in r["rewards"])
            verdict = Text("ok", style="green") if r["consistent"] else Text("MISMATCH", style="bold red")
            count = f"{len(r['rewards'])}/{r['sibling_count']}"
            rewards.add_row(escape(str(r["rollout"])), count, escape(cells), verdict)
            head = Text.assemble(f"rollout {r['rollout']}, {count} siblings: ", verdict)
            blocks.append(Flow(head, first=2, indent=4))
            blocks.append(Flow(cells, first=4, indent=4))
        parts.append(
            titled(
                "sibling rewards by rollout (all siblings of a rollout must share one reward)",
                Fit(rewards, Group(*blocks)),
            )
        )
    elif len(doc["group_members"]) > 1:
        members = Table()
        for name in ("p:offset", "rollout", "sibling", "reward"):
            members.add_column(name, justify="right", no_wrap=True)
        lines = []
        for m in doc["group_members"]:
            sib = f"{m['sibling_index']}/{m['sibling_count']}" if m["sibling_index"] is not None else "-"
            members.add_row(
                f"{m['partition']}:{m['offset']}",
                escape(_cell(m["rollout"])),
                sib,
                escape(_cell(m["reward"])),
            )
            lines.append(
                Flow(
                    f"{m['partition']}:{m['offset']}  rollout {_cell(m['rollout'])}, sibling {sib}, "
                    f"reward {_cell(m['reward'])}",
                    first=2,
                    indent=4,
                )
            )
        parts.append(titled("members of the group dead-lettered with it", Fit(members, Group(*lines))))
    return Group(*parts)


def _action(kind: str, dry_run: bool) -> str:
    return ("would_replay" if dry_run else "replayed") if kind == "replay" else kind


def replay_document(report: ReplayReport) -> dict[str, Any]:
    return {
        "dry_run": report.dry_run,
        "cursor": report.cursor,
        "replay_id": report.replay_id,
        "resumed": report.resumed,
        "scanned": report.scanned,
        "matched": report.matched,
        "replayed": report.replayed,
        "refused": report.refused,
        "already_replayed": report.already_replayed,
        "to_topics": dict(report.by_topic),
        "transactions": report.transactions,
        "elapsed_s": round(report.elapsed_s, 3),
        "cursor_start": {r.partition: r.start for r in report.plan.ranges} if report.plan else {},
        "chunked_values": report.chunked_values,
        "chunk_records": report.chunk_records,
        "records": [_action_entry(a, report.dry_run) for a in report.actions],
        "records_truncated": report.actions_truncated,
    }


def _action_entry(a: ReplayAction, dry_run: bool) -> dict[str, Any]:
    """One replayed value: a plain record, or a chunked value at its first chunk (`chunks`: how many)."""
    entry = {
        "partition": a.record.partition,
        "offset": a.record.offset,
        "reason": a.record.reason,
        "group_key": a.record.group,
        "action": _action(a.kind, dry_run),
        "to": a.topic,
        "replay_count": a.replay_count if a.kind == "replay" else a.record.replay_count,
        "why": a.refused or a.skipped,
    }
    if a.chunks:
        entry["chunks"] = a.chunks
    return entry


_ACTION_STYLE = {"refused": "red", "already_replayed": "dim", "would_replay": "yellow", "replayed": "green"}


def replay_view(doc: dict[str, Any], rows: int) -> RenderableType:
    parts: list[RenderableType] = []
    shown = doc["records"][:rows]
    if shown:
        table = Table()
        for name in ("p:offset", "reason", "group", "replay count", "action", "to, or why not"):
            table.add_column(
                name,
                no_wrap=True,
                justify="right" if name in ("p:offset", "replay count") else "left",
            )
        blocks: list[RenderableType] = []
        for r in shown:
            action = Text(r["action"].replace("_", " "), style=_ACTION_STYLE[r["action"]])
            table.add_row(
                f"{r['partition']}:{r['offset']}",
                r["reason"],
                escape(_cell(r["group_key"])),
                str(r["replay_count"]),
                action,
                escape(_where(r)),
            )
            blocks.append(_replay_block(r, action))
        parts.append(Fit(table, Group(*blocks)))
        if len(doc["records"]) > len(shown) or doc["records_truncated"]:
            parts.append(
                Flow(f"… {doc['matched'] - len(shown)} more (--json lists up to {len(doc['records'])})")
            )
    verb = "would replay" if doc["dry_run"] else "replayed"
    chunked = (
        f"; {doc['chunked_values']} of them chunked values, as {doc['chunk_records']} chunk records"
        if doc.get("chunk_records")
        else ""
    )
    where = ", ".join(f"{n} to {t}" for t, n in doc["to_topics"].items()) or "nothing"
    already = f"; {doc['already_replayed']} replayed before" if doc["already_replayed"] else ""
    run = ""
    if doc["replayed"] and (doc["resumed"] or not doc["dry_run"]):
        run = f"; replay id {doc['replay_id']}" + (" (resumed)" if doc["resumed"] else "")
    parts.append(
        Flow(
            f"{verb} {doc['replayed']} record(s) ({where}){chunked}; refused {doc['refused']}{already}; "
            f"{doc['scanned']} scanned past the cursor {doc['cursor']}{run}"
            + ("; dry run: nothing written" if doc["dry_run"] else ""),
            indent=4,
        )
    )
    return Group(*parts)


def _where(r: dict[str, Any]) -> str:
    """The destination, or why not; for a chunked value also how many chunk records go with it."""
    text = r["to"] or r["why"] or ""
    return f"{text} ({r['chunks']} chunk records)" if r.get("chunks") else text


def _replay_block(r: dict[str, Any], action: Text) -> RenderableType:
    """One record of a replay where its table row does not fit: coordinates, reason, group; then what
    became of it."""
    head = Text.assemble((f"{r['partition']}:{r['offset']}", "bold"), f"  {r['reason']}")
    if r["group_key"] is not None:
        head.append(f"  group {r['group_key']}")
    what = action.copy()
    if r.get("chunks"):
        what.append(f" ({r['chunks']} chunk records)")
    if r["to"]:
        what.append(f" to {r['to']}, replay count {r['replay_count']}")
    elif r["why"]:
        what.append(f": {r['why']}")
    return Group(Flow(head, indent=4), Flow(what, first=4, indent=6))
