"""How the dlq commands print: rich tables for people, JSON documents (or JSON lines) for scripts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from codec import DecodeError, Sample
from stream.dlq.inspect import RolloutRewards, hexdump, sample_fields
from stream.dlq.record import DeadLetterRecord, SampleHead, iso_ms
from stream.dlq.replay import ReplayReport

__all__ = [
    "json_line",
    "list_table",
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


def list_table(rows: Sequence[dict[str, Any]], width: int = 120) -> Table:
    """`dlq list`: one line per record (`DeadLetterRecord.summary()`); the message is cut to fit `width`."""
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
            (r["message"] or "").replace("\n", " "),
        ]
        for r in rows
    ]
    if not any(r["replay_count"] for r in rows):  # the usual case: no column of zeros
        names.pop(6)
        for c in cells:
            c.pop(6)
    widths = [max([len(name), *(len(c[i]) for c in cells)]) for i, name in enumerate(names)]
    # Box drawing takes 3 characters per column plus 1; the message gets what is left.
    room = max(12, width - sum(widths[:-1]) - 3 * len(names) - 1)
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


def stats_view(doc: dict[str, Any]) -> RenderableType:
    """`dlq stats`: reasons, time span, top groups and partitions of a `DeadLetterStats.to_dict()`."""
    parts: list[RenderableType] = []
    head = Text.assemble((f"{doc['topic']}", "bold"), f": {doc['matched']} dead-letter records")
    if doc["scanned"] != doc["matched"]:
        head.append(f" match the filters ({doc['scanned']} scanned)")
    parts.append(head)
    if doc["matched"]:
        old, new = doc["oldest"], doc["newest"]
        parts.append(
            Text(
                f"oldest {old['dead_lettered_at']}  {old['partition']}:{old['offset']}  {old['reason']}\n"
                f"newest {new['dead_lettered_at']}  {new['partition']}:{new['offset']}  {new['reason']}"
            )
        )
    reasons = Table(title="by reason", title_justify="left")
    reasons.add_column("reason")
    reasons.add_column("records", justify="right")
    reasons.add_column("share", justify="right")
    for reason, n in doc["by_reason"].items():
        reasons.add_row(reason, str(n), f"{100 * n / max(doc['matched'], 1):.1f}%")
    parts.append(reasons)
    exact = (
        ""
        if doc["top_groups_exact"]
        else f" (approximate: counts may be up to {doc['top_groups_max_undercount']} low)"
    )
    distinct = f", {doc['distinct_groups']} groups in all" if doc["distinct_groups"] is not None else ""
    groups = Table(title=f"top groups{distinct}{exact}", title_justify="left")
    for name, justify in (
        ("group", "left"),
        ("records", "right"),
        ("reasons", "left"),
        ("first failure", "left"),
    ):
        groups.add_column(name, justify=justify)  # type: ignore[arg-type]
    for g in doc["top_groups"]:
        groups.add_row(
            escape(g["group_key"]), str(g["records"]), ", ".join(g["reasons"]), g["first_failed_at"]
        )
    parts.append(groups)
    if len(doc["by_original_topic"]) > 1:
        topics = Table(title="by original topic", title_justify="left")
        topics.add_column("topic")
        topics.add_column("records", justify="right")
        for t, n in doc["by_original_topic"].items():
            topics.add_row(escape(t), str(n))
        parts.append(topics)
    parts_table = Table(title="partitions (offsets: log start, end at scan start)", title_justify="left")
    for name in ("partition", "log start", "end", "scanned from", "matched", "first matched", "last matched"):
        parts_table.add_column(name, justify="right")
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
    parts.append(parts_table)
    if doc["replayed_before"]:
        parts.append(
            Text(f"{doc['replayed_before']} of these failed again after a replay (x-replay-count set)")
        )
    return Group(*parts)


def _array_text(value: Any) -> str:
    if isinstance(value, dict) and "dtype" in value:
        more = "…" if value["length"] > len(value["head"]) else ""
        return f"{value['dtype']}[{value['length']}] {', '.join(map(str, value['head']))}{more}"
    return str(value)


def show_document(
    record: DeadLetterRecord,
    decoded: Sample | DecodeError,
    members: list[tuple[DeadLetterRecord, SampleHead | None]],
    rewards: list[RolloutRewards] | None,
) -> dict[str, Any]:
    """`dlq show --json`: every header, the decoded sample or a hex preview, group members nearby."""
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
        "headers": [[k, v.decode("utf-8", "backslashreplace")] for k, v in record.headers],
    }
    if isinstance(decoded, DecodeError):
        doc["decode_error"] = decoded.message
        doc["hex_preview"] = hexdump(record.value or b"")
    else:
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


def show_view(doc: dict[str, Any]) -> RenderableType:
    parts: list[RenderableType] = [
        Text.assemble(
            (f"{doc['topic']} {doc['partition']}:{doc['offset']}", "bold"),
            "  ",
            (doc["reason"], "bold red"),
            f"  group {doc['group_key']}",
        ),
        Text(doc["message"]),
    ]
    headers = Table(title="headers", title_justify="left", show_header=False)
    headers.add_column("name", style="cyan")
    headers.add_column("value", overflow="fold")
    for k, v in doc["headers"]:
        headers.add_row(escape(k), escape(v))
    parts.append(headers)
    if "sample" in doc:
        fields = Table(title="decoded sample", title_justify="left", show_header=False)
        fields.add_column("field", style="cyan")
        fields.add_column("value", overflow="fold")
        for k, v in doc["sample"].items():
            fields.add_row(k, escape(_array_text(v)))
        parts.append(fields)
    else:
        parts.append(Text(f"does not decode: {doc['decode_error']}", style="yellow"))
        parts.append(Text(f"{doc['value_bytes'] or 0} bytes:\n" + "\n".join(doc["hex_preview"])))
    if doc.get("sibling_rewards"):
        rewards = Table(
            title="sibling rewards by rollout (all siblings of a rollout must share one reward)",
            title_justify="left",
        )
        rewards.add_column("rollout", justify="right")
        rewards.add_column("siblings", justify="right")
        rewards.add_column("reward of each sibling (by sibling_index)")
        rewards.add_column("")
        for r in doc["sibling_rewards"]:
            cells = "   ".join(f"s{x['sibling_index']}={x['reward']}" for x in r["rewards"])
            verdict = Text("ok", style="green") if r["consistent"] else Text("MISMATCH", style="bold red")
            rewards.add_row(
                escape(str(r["rollout"])), f"{len(r['rewards'])}/{r['sibling_count']}", escape(cells), verdict
            )
        parts.append(rewards)
    elif len(doc["group_members"]) > 1:
        members = Table(title="members of the group dead-lettered with it", title_justify="left")
        for name in ("p:offset", "rollout", "sibling", "reward"):
            members.add_column(name, justify="right")
        for m in doc["group_members"]:
            sib = f"{m['sibling_index']}/{m['sibling_count']}" if m["sibling_index"] is not None else "-"
            members.add_row(
                f"{m['partition']}:{m['offset']}",
                escape(_cell(m["rollout"])),
                sib,
                escape(_cell(m["reward"])),
            )
        parts.append(members)
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
        "records": [
            {
                "partition": a.record.partition,
                "offset": a.record.offset,
                "reason": a.record.reason,
                "group_key": a.record.group,
                "action": _action(a.kind, report.dry_run),
                "to": a.topic,
                "replay_count": a.replay_count if a.kind == "replay" else a.record.replay_count,
                "why": a.refused or a.skipped,
            }
            for a in report.actions
        ],
        "records_truncated": report.actions_truncated,
    }


_ACTION_STYLE = {"refused": "red", "already_replayed": "dim", "would_replay": "yellow", "replayed": "green"}


def replay_view(doc: dict[str, Any], rows: int) -> RenderableType:
    parts: list[RenderableType] = []
    shown = doc["records"][:rows]
    if shown:
        table = Table()
        for name in ("p:offset", "reason", "group", "replay count", "action", "to, or why not"):
            table.add_column(
                name,
                no_wrap=name != "to, or why not",
                overflow="fold",
                justify="right" if name in ("p:offset", "replay count") else "left",
            )
        for r in shown:
            table.add_row(
                f"{r['partition']}:{r['offset']}",
                r["reason"],
                escape(_cell(r["group_key"])),
                str(r["replay_count"]),
                Text(r["action"].replace("_", " "), style=_ACTION_STYLE[r["action"]]),
                escape(r["to"] or r["why"] or ""),
            )
        parts.append(table)
        if len(doc["records"]) > len(shown) or doc["records_truncated"]:
            parts.append(
                Text(f"… {doc['matched'] - len(shown)} more (--json lists up to {len(doc['records'])})")
            )
    verb = "would replay" if doc["dry_run"] else "replayed"
    where = ", ".join(f"{n} to {t}" for t, n in doc["to_topics"].items()) or "nothing"
    already = f"; {doc['already_replayed']} replayed before" if doc["already_replayed"] else ""
    run = ""
    if doc["replayed"] and (doc["resumed"] or not doc["dry_run"]):
        run = f"; replay id {doc['replay_id']}" + (" (resumed)" if doc["resumed"] else "")
    parts.append(
        Text(
            f"{verb} {doc['replayed']} record(s) ({where}); refused {doc['refused']}{already}; "
            f"{doc['scanned']} scanned past the cursor {doc['cursor']}{run}"
            + ("; dry run: nothing written" if doc["dry_run"] else "")
        )
    )
    return Group(*parts)
