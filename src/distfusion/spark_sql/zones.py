"""Local times of instants in a Spark session's time zone, as DataFusion SQL.

The plan carries instants as UTC and Substrait keeps no zone on a timestamp
type (a cast to a zoned type comes back as UTC), so the zone travels as a
string argument of datafusion-spark's native ``from_utc_timestamp`` (the
wall time of an instant, chrono-tz's tz database), which every context that
decodes a plan registers (:mod:`distfusion.substrait_plan.functions`).

Two things are built around it here, with ``java.time``'s answers:

- chrono-tz lists no transition after 2099, where ``java.time`` goes on with a
  zone's last rule: an instant from 2100 on, in a zone with daylight saving
  time then, is moved by whole days to the year 2072..2099 of the same
  calendar (weekday of January 1st, leap or not) and its answer moved back;
- a wall time back to an instant (``date_trunc``), resolved as
  ``ZonedDateTime.ofLocal`` does: the preferred offset if valid, the earlier
  offset in an overlap, a gap's time moved forward by the gap; midnight of
  ``LocalDate.atStartOfDay`` is the end of a gap that holds it.
"""

from __future__ import annotations

import datetime
import functools
import re
import zoneinfo

from datafusion import SessionContext
from sqlglot import exp

from distfusion.errors import SparkSemanticsError

__all__ = [
    "UTC_ZONES",
    "instant_of",
    "local_time",
    "python_zone",
    "session_zone",
    "truncated_instant",
]

UTC_ZONES = frozenset(
    {
        "UTC",
        "Etc/UTC",
        "GMT",
        "Etc/GMT",
        "Z",
        "+00:00",
        "UCT",
        "Etc/UCT",
        "Universal",
        "Etc/Universal",
        "Zulu",
        "Etc/Zulu",
        "GMT0",
        "Etc/GMT0",
        "Greenwich",
        "Etc/Greenwich",
    }
)
"""Session time zones whose local time is UTC's."""

# java.time.ZoneId.SHORT_IDS, which Spark reads a session zone with: their
# meaning differs from the tz database's zones of the same name (EST, MST)
_SHORT_IDS = frozenset(
    "ACT AET AGT ART AST BET BST CAT CNT CST CTT EAT ECT EST HST IET IST JST MIT MST NET "
    "NST PLT PNT PRC PST SST VST".split()
)
_OFFSET = re.compile(r"^(?:UTC|GMT|UT)?([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?$")
_UTC_TYPE = 'Timestamp(Microsecond, Some("UTC"))'
_LAST_LISTED_YEAR = 2099  # chrono-tz's transitions end with it
_SAME_CALENDARS = range(2072, 2100)  # 28 years: every calendar, the zones' last rules
_EPOCH = datetime.date(1970, 1, 1)
_DAY_UNITS = ("minute", "hour", "day")  # ZonedDateTime.truncatedTo: the offset kept if valid
# Midnights inside a gap that began before them (tz database; none after 1919):
# LocalDate.atStartOfDay gives the gap's end, the transition's instant.
_MIDNIGHTS_IN_GAPS = {
    zone: (("1919-03-31T00:00:00Z", "1919-03-31T04:30:00Z"),)
    for zone in (
        "America/Toronto",
        "America/Montreal",
        "America/Nipigon",
        "America/Thunder_Bay",
        "Canada/Eastern",
    )
}


def session_zone(name: str) -> str | None:
    """The zone argument of ``from_utc_timestamp`` for Spark session time zone ``name``.

    None for UTC (local times are UTC's); ``+hh:mm`` for a fixed offset
    (``+05:30``, ``-8``, ``GMT+5``, ``UTC-03:00`` as ``java.time`` reads
    them); a tz database name as it is.

    Raises:
        SparkSemanticsError: a zone translated nowhere: an offset with
            seconds, a short ID of ``java.time`` (``PST``, ``EST``), a name
            the tz database or chrono-tz does not know.
    """
    if name in UTC_ZONES:
        return None
    m = _OFFSET.match(name)
    if m is not None:
        sign, hours, minutes, seconds = m.groups()
        if int(seconds or 0):
            raise SparkSemanticsError(f"session time zone {name!r}: an offset with seconds")
        if int(hours) == 0 and int(minutes or 0) == 0:
            return None
        return f"{sign}{int(hours):02d}:{int(minutes or 0):02d}"
    if name in _SHORT_IDS:
        msg = f"session time zone {name!r}: a short zone ID (java.time's SHORT_IDS)"
        raise SparkSemanticsError(msg)
    if not _known(name):
        raise SparkSemanticsError(f"session time zone {name!r}: unknown to chrono-tz")
    return name


def python_zone(zone: str | None) -> datetime.tzinfo:
    """Python's zone for ``zone`` of :func:`session_zone` (None: UTC)."""
    if zone is None:
        return datetime.UTC
    if zone[0] in "+-":
        hours, minutes = zone[1:].split(":")
        offset = datetime.timedelta(hours=int(hours), minutes=int(minutes))
        return datetime.timezone(offset if zone[0] == "+" else -offset)
    return zoneinfo.ZoneInfo(zone)


@functools.cache
def _known(name: str) -> bool:
    """Whether the tz database (Python's) and chrono-tz (DataFusion's) both know ``name``."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    ctx = SessionContext()
    ctx.enable_spark_functions()
    try:
        ctx.sql(f"SELECT from_utc_timestamp(TIMESTAMP '2000-01-01', '{name}')").collect()
    except Exception:  # DataFusion's: an invalid zone
        return False
    return True


@functools.cache
def _changes_after_listed(zone: str) -> bool:
    """Whether ``zone``'s offset still changes after chrono-tz's last listed year."""
    if zone[0] in "+-":
        return False
    tz = zoneinfo.ZoneInfo(zone)
    year = _LAST_LISTED_YEAR + 51
    offsets = {
        datetime.datetime(year, month, 15, tzinfo=datetime.UTC).astimezone(tz).utcoffset()
        for month in range(1, 13)
    }
    return len(offsets) > 1


def _timestamp(text: str) -> exp.Expr:
    return exp.Anonymous(
        this="arrow_cast", expressions=[exp.Literal.string(text), exp.Literal.string(_UTC_TYPE)]
    )


def _wall(node: exp.Expr, zone: str) -> exp.Expr:
    """``from_utc_timestamp(node, zone)``: the wall time of instant ``node``, read as UTC."""
    return exp.Anonymous(
        this="from_utc_timestamp", expressions=[node.copy(), exp.Literal.string(zone)]
    )


def _sub(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    return exp.Paren(this=exp.Sub(this=a.copy(), expression=b.copy()))


def _add(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    return exp.Paren(this=exp.Add(this=a.copy(), expression=b.copy()))


def _hours(n: int) -> exp.Expr:
    return exp.Interval(this=exp.Literal.string(str(n)), unit=exp.var("HOUR"))


def _case(*branches: tuple[exp.Expr, exp.Expr], default: exp.Expr):
    return exp.Case(
        ifs=[exp.If(this=cond.copy(), true=value.copy()) for cond, value in branches],
        default=default.copy(),
    )


@functools.cache
def _calendar_days() -> tuple[int, ...]:
    """Days since 1970-01-01 of January 1st of the year of 2072..2099 with each calendar.

    Indexed by ``2 * weekday + leap`` of January 1st (Monday 0).
    """
    days = [0] * 14
    for year in _SAME_CALENDARS:
        jan1 = datetime.date(year, 1, 1)
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        days[2 * jan1.weekday() + leap] = (jan1 - _EPOCH).days
    return tuple(days)


def _shift(instant: exp.Expr, zone: str) -> exp.Expr | None:
    """How far (a duration, whole days) ``instant`` moves to a year chrono-tz lists; None: 0.

    From 2100 on, to the year of 2072..2099 whose calendar is its year's
    (January 1st on the same weekday, leap or not); a zone whose offset no
    longer changes after 2099 needs no move.
    """
    if not _changes_after_listed(zone):
        return None
    year = exp.Anonymous(this="date_part", expressions=[exp.Literal.string("year"), instant.copy()])
    jan1 = exp.Anonymous(
        this="make_date", expressions=[year.copy(), exp.Literal.number(1), exp.Literal.number(1)]
    )
    days = exp.Cast(
        this=exp.Anonymous(this="arrow_cast", expressions=[jan1, exp.Literal.string("Int32")]),
        to=exp.DataType.build("BIGINT"),
    )

    def divides(n: int) -> exp.Expr:
        return exp.EQ(
            this=exp.Mod(this=year.copy(), expression=exp.Literal.number(n)),
            expression=exp.Literal.number(0),
        )

    leap = _case(
        (divides(400), exp.Literal.number(1)),
        (divides(100), exp.Literal.number(0)),
        (divides(4), exp.Literal.number(1)),
        default=exp.Literal.number(0),
    )
    weekday = exp.Mod(this=_add(days, exp.Literal.number(3)), expression=exp.Literal.number(7))
    index = exp.Add(
        this=exp.Add(
            this=exp.Mul(this=exp.Paren(this=weekday), expression=exp.Literal.number(2)),
            expression=leap,
        ),
        expression=exp.Literal.number(1),
    )
    table = exp.Anonymous(
        this="make_array", expressions=[exp.Literal.number(d) for d in _calendar_days()]
    )
    moved = _sub(days, exp.Anonymous(this="array_element", expressions=[table, index]))
    seconds = _case(
        (
            exp.LT(
                this=instant.copy(),
                expression=_timestamp(f"{_LAST_LISTED_YEAR + 1}-01-01T00:00:00Z"),
            ),
            exp.Literal.number(0),
        ),
        default=exp.Mul(this=moved, expression=exp.Literal.number(86400)),
    )
    return exp.Anonymous(
        this="arrow_cast", expressions=[seconds, exp.Literal.string("Duration(Second)")]
    )


def local_time(instant: exp.Expr, zone: str) -> exp.Expr:
    """The wall time of ``instant`` in ``zone`` (of :func:`session_zone`), as a UTC timestamp.

    Its fields (hour, date, text) are the local time's; ``instant`` is a
    timestamp whose value is UTC (a ``TIMESTAMP``, or seconds of
    ``to_timestamp_seconds``).
    """
    instant = exp.Anonymous(this="arrow_cast", expressions=[instant, exp.Literal.string(_UTC_TYPE)])
    shift = _shift(instant, zone)
    if shift is None:
        return _wall(instant, zone)
    return _add(_wall(_sub(instant, shift), zone), shift)


def _resolved(wall: exp.Expr, zone: str) -> exp.Expr:
    """The instant of wall time ``wall`` in ``zone``, as ``ZonedDateTime.of`` resolves it.

    Every instant of a wall time lies within 18 hours of it (the widest
    offset) and a zone's transitions are days apart, so the offsets 18 hours
    before and after are those on either side of a transition: the one
    before gives the earlier instant of an overlap, and in a gap the time
    moved forward by the gap.
    """
    early = _sub(wall, _hours(18))
    late = _add(wall, _hours(18))
    before = _sub(wall, _sub(_wall(early, zone), early))
    after = _sub(wall, _sub(_wall(late, zone), late))
    return _case(
        (exp.EQ(this=_wall(before, zone), expression=wall.copy()), before),
        (exp.EQ(this=_wall(after, zone), expression=wall.copy()), after),
        default=before,
    )


def instant_of(wall: exp.Expr, zone: str) -> exp.Expr:
    """The instant of wall time ``wall`` (a ``TIMESTAMP_NTZ``) in ``zone``, as Spark casts it.

    ``LocalDateTime.atZone``: the earlier offset of an overlap, a gap's time
    moved forward by the gap.
    """
    wall = exp.Anonymous(this="arrow_cast", expressions=[wall, exp.Literal.string(_UTC_TYPE)])
    shift = _shift(wall, zone)
    if shift is None:
        return _resolved(wall, zone)
    return _add(_resolved(_sub(wall, shift), zone), shift)


def truncated_instant(unit: str, instant: exp.Expr, zone: str) -> exp.Expr:
    """Spark's ``date_trunc(unit, instant)`` in session zone ``zone``: an instant.

    ``unit`` is DataFusion's (``second`` .. ``year``). Spark truncates a
    second without the zone; a minute, hour or day as
    ``ZonedDateTime.truncatedTo`` (the instant's offset kept where it is
    valid); a week, month, quarter or year at the start of the local date
    (``LocalDate.atStartOfDay``).
    """
    if unit == "second":
        return exp.Anonymous(this="date_trunc", expressions=[exp.Literal.string(unit), instant])
    instant = exp.Anonymous(this="arrow_cast", expressions=[instant, exp.Literal.string(_UTC_TYPE)])
    shift = _shift(instant, zone)
    moved = instant if shift is None else _sub(instant, shift)
    local = _wall(moved, zone)
    wall = exp.Anonymous(this="date_trunc", expressions=[exp.Literal.string(unit), local.copy()])
    out = _resolved(wall, zone)
    if unit in _DAY_UNITS:
        kept = _sub(moved, _sub(local, wall))
        out = _case((exp.EQ(this=_wall(kept, zone), expression=wall.copy()), kept), default=out)
    else:
        gaps = _MIDNIGHTS_IN_GAPS.get(zone, ())
        if gaps:
            out = _case(
                *(
                    (exp.EQ(this=wall.copy(), expression=_timestamp(m)), _timestamp(t))
                    for m, t in gaps
                ),
                default=out,
            )
    return out if shift is None else _add(out, shift)
