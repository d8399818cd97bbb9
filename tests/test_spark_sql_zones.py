"""Local times in non-UTC Spark session zones, without a SparkSession: java.time's answers.

The reference here is a model of what Spark computes with ``java.time``
(Python's ``zoneinfo`` reads the same tz database and, past its listed
transitions, the zone's last rule as ``java.time`` does): an instant's wall
time; ``ZonedDateTime.truncatedTo`` keeping the offset where valid;
``ZonedDateTime.of`` taking the earlier offset of an overlap and moving a
gap's time forward; ``LocalDate.atStartOfDay`` taking a gap's end. Spark
itself checks a few of the same cases in tests/runtime/test_spark_sql_semantics.py.
The queries run translated on the local runtime (planned, sent as Substrait,
decoded by the workers).
"""

from __future__ import annotations

import datetime
import random
import zoneinfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distfusion import DistributedConfig, DistributedContext, LocalRuntime
from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import SparkSettings, translate
from distfusion.spark_sql.zones import session_zone

UTC = datetime.UTC
ZONES = [
    "America/Los_Angeles",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Australia/Sydney",
    "Australia/Lord_Howe",  # a half-hour DST change
    "America/Havana",  # DST changes at midnight
    "America/Toronto",  # 1919: a midnight inside a gap
    "America/Sao_Paulo",
    "Pacific/Chatham",
    "+05:30",
    "-08:00",
]
UNITS = ["MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "QUARTER", "YEAR"]


def _tz(zone: str) -> datetime.tzinfo:
    if zone[0] in "+-":
        sign = 1 if zone[0] == "+" else -1
        hours, minutes = zone[1:].split(":")
        return datetime.timezone(sign * datetime.timedelta(hours=int(hours), minutes=int(minutes)))
    return zoneinfo.ZoneInfo(zone)


def _wall(instant: datetime.datetime, tz) -> datetime.datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def _offsets(wall: datetime.datetime, tz) -> list[datetime.timedelta]:
    """The valid offsets of ``wall``, earlier first (empty in a gap)."""
    out = []
    for fold in (0, 1):
        off = wall.replace(tzinfo=tz, fold=fold).utcoffset()
        if off not in out and _wall((wall - off).replace(tzinfo=UTC), tz) == wall:
            out.append(off)
    return out


def _of_local(wall: datetime.datetime, tz, preferred=None) -> datetime.datetime:
    """ZonedDateTime.ofLocal(wall, tz, preferred).toInstant()."""
    valid = _offsets(wall, tz)
    if preferred in valid:
        off = preferred
    elif valid:
        off = valid[0]
    else:  # a gap: the offset before it, so the time moves forward by the gap
        off = wall.replace(tzinfo=tz, fold=0).utcoffset()
    return (wall - off).replace(tzinfo=UTC)


def _start_of_day(day: datetime.date, tz) -> datetime.datetime:
    """LocalDate.atStartOfDay(tz).toInstant(): a gap's end when midnight lies in it."""
    wall = datetime.datetime.combine(day, datetime.time())
    if _offsets(wall, tz):
        return _of_local(wall, tz)
    lo = (wall - wall.replace(tzinfo=tz, fold=1).utcoffset()).replace(tzinfo=UTC)
    hi = (wall - wall.replace(tzinfo=tz, fold=0).utcoffset()).replace(tzinfo=UTC)
    before = lo.astimezone(tz).utcoffset()
    while hi - lo > datetime.timedelta(seconds=1):  # the transition's instant
        mid = lo + (hi - lo) / 2
        lo, hi = (mid, hi) if mid.astimezone(tz).utcoffset() == before else (lo, mid)
    return hi


def _truncated(instant: datetime.datetime, unit: str, tz) -> datetime.datetime:
    """Spark's date_trunc(unit, instant) (DateTimeUtils.truncTimestamp)."""
    wall = _wall(instant, tz)
    if unit in ("MINUTE", "HOUR", "DAY"):
        fields = {"MINUTE": {"second": 0}, "HOUR": {"minute": 0, "second": 0}}.get(
            unit, {"hour": 0, "minute": 0, "second": 0}
        )
        cut = wall.replace(microsecond=0, **fields)
        return _of_local(cut, tz, instant.astimezone(tz).utcoffset())
    day = wall.date()
    if unit == "WEEK":
        day -= datetime.timedelta(days=day.weekday())
    elif unit == "MONTH":
        day = day.replace(day=1)
    elif unit == "QUARTER":
        day = day.replace(month=(day.month - 1) // 3 * 3 + 1, day=1)
    else:
        day = day.replace(month=1, day=1)
    return _start_of_day(day, tz)


def _instants(zone: str) -> list[datetime.datetime]:
    """Instants around the zone's changes (1919..2187), and spread over 1678..2261.

    DataFusion's ``date_trunc`` and ``to_char`` take nanoseconds: outside
    those years they fail (in a UTC session too).
    """
    tz = _tz(zone)
    rng = random.Random(zone)
    out = []
    changes = []
    for year in (1919, 1945, 1970, 1996, 2024, 2025, 2037, 2099, 2150, 2187):
        t = datetime.datetime(year, 1, 1, tzinfo=UTC)
        previous = t.astimezone(tz).utcoffset()
        while t.year == year:
            t += datetime.timedelta(hours=6)
            if t.astimezone(tz).utcoffset() != previous:
                lo = t - datetime.timedelta(hours=6)
                while t - lo > datetime.timedelta(seconds=1):
                    mid = lo + (t - lo) / 2
                    lo, t = (mid, t) if mid.astimezone(tz).utcoffset() == previous else (lo, mid)
                changes.append(t.replace(microsecond=0))
                previous = t.astimezone(tz).utcoffset()
    for change in changes:
        for minutes in (-1441, -181, -61, -31, -1, 0, 1, 29, 59, 61, 121, 1439, 1501):
            out.append(change + datetime.timedelta(minutes=minutes, seconds=rng.randint(0, 59)))
    for _ in range(300):
        seconds = rng.randint(-9214560000, 9214560000)  # years 1678 .. 2261
        out.append(datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(seconds=seconds))
    return out


def _context(zone: str, runtime=None) -> DistributedContext:
    """A context of Spark's dialect in ``zone`` whose queries run as stages on workers."""
    settings = SparkSettings(time_zone=zone)
    return DistributedContext(
        runtime=runtime or LocalRuntime(workers=2),
        config=DistributedConfig(
            sql_dialect="spark", spark=settings, tasks_per_stage=2, in_place_bytes=0
        ),
    )


@pytest.mark.parametrize("zone", ZONES)
def test_local_times_and_truncation_are_java_times(zone):
    tz = _tz(zone)
    instants = _instants(zone)
    seconds = [int(t.timestamp()) for t in instants]
    # wall times around the changes, in their gaps and overlaps too
    walls = [_wall(t, tz) + datetime.timedelta(minutes=30) for t in instants]
    ctx = _context(zone)
    try:
        ctx.from_pydict(
            {
                "k": pa.array(range(len(instants)), pa.int64()),
                "ts": pa.array(instants, pa.timestamp("us", tz="UTC")),
                "b": pa.array(seconds, pa.int64()),
                "tn": pa.array(walls, pa.timestamp("us")),
            },
            name="t",
        )
        truncs = ", ".join(f"date_trunc('{u}', ts) AS t_{u.lower()}" for u in UNITS)
        sql = (
            "SELECT k, hour(ts) AS h, minute(ts) AS m, second(ts) AS s, to_date(ts) AS d, "
            "CAST(ts AS DATE) AS c, date_format(ts, 'yyyy-MM-dd HH:mm:ss') AS f, "
            f"from_unixtime(b) AS u, date_format(tn, 'yyyy-MM-dd HH:mm') AS n, hour(tn) AS nh, "
            f"{truncs} FROM t ORDER BY k"
        )
        rows = ctx.sql(sql).to_pylist()
    finally:
        ctx.close()
    bad = []
    for t, tn, row in zip(instants, walls, rows, strict=True):
        wall = _wall(t, tz)
        text = wall.strftime("%Y-%m-%d %H:%M:%S")
        expected = {
            "h": wall.hour,
            "m": wall.minute,
            "s": wall.second,
            "d": wall.date(),
            "c": wall.date(),
            "f": text,
            "u": _wall(t.replace(microsecond=0), tz).strftime("%Y-%m-%d %H:%M:%S"),
            # Spark casts a TIMESTAMP_NTZ to a TIMESTAMP to format it, reads its hour as it is
            "n": _wall(_of_local(tn, tz), tz).strftime("%Y-%m-%d %H:%M"),
            "nh": tn.hour,
            **{f"t_{u.lower()}": _truncated(t, u, tz) for u in UNITS},
        }
        got = {key: row[key] for key in expected}
        if got != expected:
            diff = {key: (got[key], expected[key]) for key in expected if got[key] != expected[key]}
            bad.append((t.isoformat(), diff))
    assert not bad, f"{len(bad)} of {len(rows)} differ, e.g. {bad[:3]}"


@pytest.mark.parametrize("runtime", ["local", "flight"])
def test_the_zone_reaches_the_workers_in_the_plan(runtime, request, tmp_path):
    # A zoned type does not survive Substrait (it comes back as UTC); the zone
    # as from_utc_timestamp's argument does, and the workers know the function.
    workers = None
    if runtime == "flight":
        from distfusion.runtime.flight import FlightRuntime

        workers = FlightRuntime(request.getfixturevalue("flight_workers"))
    for part in range(2):  # two files: a leaf stage of two tasks on the workers
        stamps = [
            datetime.datetime(2024, 3, 10, 20, 40 + 10 * part + i, tzinfo=UTC) for i in (0, 1)
        ]
        table = pa.table(
            {
                "i": pa.array([2 * part, 2 * part + 1], pa.int32()),
                "ts": pa.array(stamps, pa.timestamp("us", "UTC")),
            }
        )
        pq.write_table(table, tmp_path / f"part-{part}.parquet")
    ctx = _context("Asia/Kolkata", workers)
    try:
        ctx.register_parquet("t", str(tmp_path))
        df = ctx.sql(
            "SELECT hour(ts) AS h, date_trunc('HOUR', ts) AS d, count(*) AS n FROM t GROUP BY 1, 2"
        )
        plan = df.explain()
        assert "Stage 2" in plan and "from_utc_timestamp" in plan, plan
        rows = df.to_pylist()
    finally:
        ctx.close()
    # 20:40..21:01 UTC is 02:10..02:31 IST on the 11th
    assert rows == [{"h": 2, "d": datetime.datetime(2024, 3, 10, 20, 30, tzinfo=UTC), "n": 4}]


def test_instants_past_2099_move_to_a_year_of_the_same_calendar():
    # chrono-tz lists no change after 2099; java.time (and zoneinfo) go on with the rule
    ctx = _context("America/Los_Angeles")
    try:
        ctx.from_pydict(
            {
                "ts": pa.array(
                    [datetime.datetime(2150, 7, 4, 12, tzinfo=UTC)], pa.timestamp("us", "UTC")
                )
            },
            name="t",
        )
        rows = ctx.sql("SELECT hour(ts) AS h, date_trunc('DAY', ts) AS d FROM t").to_pylist()
    finally:
        ctx.close()
    assert rows == [{"h": 5, "d": datetime.datetime(2150, 7, 4, 7, tzinfo=UTC)}]  # PDT


@pytest.mark.parametrize(
    ("name", "zone"),
    [
        ("UTC", None),
        ("+00:00", None),
        ("+05:30", "+05:30"),
        ("-8", "-08:00"),
        ("GMT+5", "+05:00"),
        ("UTC-03:30", "-03:30"),
        ("Europe/Berlin", "Europe/Berlin"),
        ("Etc/GMT+5", "Etc/GMT+5"),
    ],
)
def test_session_zones_read_as_java_reads_them(name, zone):
    assert session_zone(name) == zone


@pytest.mark.parametrize(
    ("name", "reason"),
    [("PST", "short zone ID"), ("+05:30:15", "seconds"), ("Mars/Olympus_Mons", "unknown")],
)
def test_zones_without_a_translation_say_why(name, reason):
    schema = pa.schema([("ts", pa.timestamp("us", "UTC"))])
    with pytest.raises(SparkSemanticsError, match=reason):
        translate("SELECT hour(ts) FROM t", lambda n: schema, SparkSettings(time_zone=name))


def test_a_timestamp_literal_at_a_fixed_offset_is_its_instant():
    schema = pa.schema([("ts", pa.timestamp("us", "UTC"))])
    sql = translate(
        "SELECT ts FROM t WHERE ts >= '2024-03-10 02:30'",
        lambda n: schema,
        SparkSettings(time_zone="+05:30"),
    )
    assert "'2024-03-09T21:00:00.000000Z'" in sql
