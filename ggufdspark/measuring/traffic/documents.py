"""Long documents for the load benchmark's prompt set, composed here from fixed pools of phrases
with a seeded generator: an incident timeline, meeting minutes, a server log excerpt, customer
reviews and a sales table, each with the question a user would ask about it (summarize, find the
cause, list the actions). Deterministic (``random.Random(seed)`` per document, the same on every
machine and Python 3 version), no network; the sizes are a fixed ladder of entry counts, so the set
spans a few hundred to a few thousand tokens (``ggufdspark.measuring.traffic`` states the measured spread).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TEAMS = ["payments", "search", "checkout", "identity", "storage", "billing", "notifications", "catalog"]
PEOPLE = ["Amira", "Bruno", "Chen", "Dana", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko", "Luis"]
REGIONS = ["North", "South", "East", "West", "Central", "Coastal"]
PRODUCTS = ["kettle", "desk lamp", "backpack", "blender", "headphones", "office chair"]
SERVICES = ["api-gateway", "order-service", "auth", "inventory", "db-primary", "cache", "queue-worker"]

INCIDENT_EVENTS = [
    "the error rate on {svc} rose from 0.2% to {pct}% within two minutes",
    "{who} from the {team} team acknowledged the page and opened the incident channel",
    "dashboards showed the connection pool of {svc} at {n} of {m} connections",
    "a rollback of the morning's release of {svc} was started by {who}",
    "customers reported failed payments on the status page forum",
    "{who} noticed that retries from {svc} doubled the load on the database",
    "the on-call database engineer raised the connection limit from {m} to {m2}",
    "latency at the 99th percentile of {svc} reached {ms} ms",
    "{who} paused the batch export job that had started at the top of the hour",
    "the cache hit ratio of {svc} dropped to {pct2}% after a configuration push",
    "traffic was shifted away from the {region} data centre",
    "{who} confirmed that the queue backlog was draining at {n} messages per second",
    "a feature flag introduced in the release was turned off for all users",
    "error rates returned to normal levels and the incident was downgraded",
    "{who} posted a first customer-facing update with the affected time window",
]
MINUTES_TOPICS = ["the office move", "the hiring plan", "the budget for next quarter", "the customer survey",
                  "the on-call rotation", "the security audit", "the product launch", "the training programme"]
MINUTES_SENTENCES = [
    "{who} summarized the current state of {topic} and said that the main open question is the timeline.",
    "{who} reported that the estimate grew by {pct} percent since the last meeting, mostly because of vendor costs.",
    "The group agreed that {who} will prepare two alternatives for {topic} before the next meeting.",
    "{who} objected that the plan does not account for the holiday period, when half of the team is away.",
    "After some discussion the group decided to postpone the decision on {topic} by two weeks.",
    "{who} asked whether the {team} team had been consulted; nobody was sure, so {who2} will ask them.",
    "The budget owner confirmed that up to {m} thousand euros are available without further approval.",
    "{who} shared the results of a small pilot: {k} of 12 participants rated it positively.",
    "A risk was raised that {topic} could delay the release of the {team} project.",
    "{who} will send a written summary of {topic} to all attendees by Friday.",
]
LOG_LINES = [
    "{svc} INFO request completed method=GET path=/v1/orders/{n} status=200 duration_ms={ms}",
    "{svc} INFO request completed method=POST path=/v1/payments status=201 duration_ms={ms}",
    "{svc} WARN slow query duration_ms={ms2} table=orders rows={n}",
    "{svc} WARN connection pool near limit in_use={m} max={m2}",
    "{svc} ERROR upstream timeout target={svc2} after_ms=2000 attempt={k}",
    "{svc} INFO cache miss key=user:{n} fallback=db",
    "{svc} ERROR failed to acquire connection within 500 ms pool=primary waiters={k}",
    "{svc} INFO health check ok latency_ms={k}",
    "{svc} WARN retrying request to {svc2} attempt={k} backoff_ms={ms}",
    "{svc} INFO batch export progress rows={n} elapsed_s={k}",
]
REVIEW_OPENINGS = ["I bought this {product} three weeks ago.", "This is my second {product} from this brand.",
                   "I was looking for a cheap {product} for my flat.", "We use the {product} every day at the office.",
                   "I got the {product} as a present."]
REVIEW_BODIES = [
    "It works as described and the build quality feels solid for the price.",
    "After a few days a small part started to rattle, which is annoying.",
    "Delivery took {k} days longer than promised and the box was damaged.",
    "The instructions were confusing and I needed a video to set it up.",
    "Customer service answered within a day and sent a replacement part.",
    "It is louder than I expected, especially in the morning when everyone is asleep.",
    "The colour is slightly different from the pictures on the website.",
    "Battery life is about {k} hours, which is less than advertised.",
    "For daily use it is comfortable, and it looks better than the older model.",
    "I had to return the first one because it did not turn on at all.",
]
REVIEW_ENDINGS = ["Overall {stars} stars.", "I would buy it again.", "I would not recommend it.",
                  "Good value, but not perfect.", "{stars} out of 5."]


@dataclass(frozen=True)
class Document:
    """One composed prompt: an id, its kind and the user message's text."""

    id: str
    kind: str
    text: str


def _fill(rng: random.Random, template: str, **fixed: str) -> str:
    """``template`` with its fields drawn from the pools (``fixed`` ones given)."""
    who, who2 = rng.sample(PEOPLE, 2)
    svc, svc2 = rng.sample(SERVICES, 2)
    m = rng.randrange(20, 120)
    values = dict(
        who=who, who2=who2, team=rng.choice(TEAMS), svc=svc, svc2=svc2, region=rng.choice(REGIONS),
        topic=rng.choice(MINUTES_TOPICS), product=rng.choice(PRODUCTS), n=rng.randrange(3, 9000), m=m, m2=m * 2,
        k=rng.randrange(1, 12), ms=rng.randrange(5, 400), ms2=rng.randrange(800, 9000), pct=rng.randrange(3, 40),
        pct2=rng.randrange(20, 70), stars=rng.randrange(1, 6))
    return template.format(**{**values, **fixed})


def _draws(rng: random.Random, pool: list[str], n: int) -> list[str]:
    """``n`` entries of ``pool``: shuffled passes over it, so repeats come only after all were used."""
    out: list[str] = []
    while len(out) < n:
        out += rng.sample(pool, len(pool))
    return out[:n]


def incident(rng: random.Random, entries: int) -> str:
    """An on-call timeline of ``entries`` events, to summarize as a post-incident report."""
    minute = rng.randrange(0, 30)
    lines = []
    for event in _draws(rng, INCIDENT_EVENTS, entries):
        minute += rng.randrange(1, 6)
        lines.append(f"{9 + minute // 60:02d}:{minute % 60:02d} UTC - {_fill(rng, event)}.")
    return ("Below is the timeline an on-call engineer wrote down during an incident.\n\n" + "\n".join(lines)
            + "\n\nWrite a post-incident summary: what happened, the likely root cause, the impact on customers, "
              "and three follow-up actions with an owner each.")


def minutes(rng: random.Random, entries: int) -> str:
    """Meeting minutes of ``entries`` agenda items, to turn into decisions and actions."""
    parts = []
    for i in range(entries):
        topic = rng.choice(MINUTES_TOPICS)
        body = " ".join(_fill(rng, s, topic=topic) for s in rng.sample(MINUTES_SENTENCES, rng.randrange(3, 6)))
        parts.append(f"Item {i + 1}: {topic}.\n{body}")
    return ("These are the minutes of our weekly coordination meeting.\n\n" + "\n\n".join(parts)
            + "\n\nList every decision that was taken and every action item with its owner, then say which "
              "topic is most at risk and why.")


def server_log(rng: random.Random, entries: int) -> str:
    """``entries`` production log lines, to find the cause of a slowdown in."""
    sec = rng.randrange(0, 3600)
    lines = []
    day = rng.randrange(1, 28)
    for line in _draws(rng, LOG_LINES, entries):
        sec += rng.randrange(0, 4)
        lines.append(f"2026-11-{day:02d}T14:{sec // 60 % 60:02d}:{sec % 60:02d}Z {_fill(rng, line)}")
    return ("Here is an excerpt of our production logs from the time users reported slow checkouts.\n\n```\n"
            + "\n".join(lines) + "\n```\n\nWhat is the most likely cause of the slowdown? Quote the log lines "
                                 "that support your answer and say what we should check next.")


def reviews(rng: random.Random, entries: int) -> str:
    """``entries`` customer reviews of one product, to summarize."""
    product = rng.choice(PRODUCTS)
    parts = []
    for i in range(entries):
        text = " ".join([_fill(rng, rng.choice(REVIEW_OPENINGS), product=product)]
                        + [_fill(rng, s) for s in rng.sample(REVIEW_BODIES, rng.randrange(2, 5))]
                        + [_fill(rng, rng.choice(REVIEW_ENDINGS))])
        parts.append(f"Review {i + 1} ({rng.choice(PEOPLE)}): {text}")
    return (f"We collected these customer reviews of our {product}.\n\n" + "\n".join(parts)
            + "\n\nSummarize the overall sentiment, list the three most frequent complaints with how many "
              "reviews mention each, and suggest what the product team should fix first.")


def sales_table(rng: random.Random, entries: int) -> str:
    """A CSV sales table of ``entries`` rows, to analyse."""
    rows = ["month,region,product,units,revenue_eur,returns"]
    for i in range(entries):
        units = rng.randrange(40, 900)
        rows.append(f"2026-{i % 12 + 1:02d},{rng.choice(REGIONS)},{rng.choice(PRODUCTS)},{units},"
                    f"{units * rng.randrange(15, 120)},{rng.randrange(0, units // 10 + 1)}")
    return ("The table below is our sales export for this year (CSV).\n\n" + "\n".join(rows)
            + "\n\nWhich region and product grew fastest, which has the highest return rate, and what "
              "would you tell the sales team in three sentences?")


# kind -> (composer, entry counts): each count gives one document, about 400, 800, 1300, 1900 and
# 2600 tokens on the generated pairs' tokenizer (measured: docs/bench.md, "Load mode").
COMPOSERS = {
    "incident": (incident, (5, 13, 23, 35, 48)),
    "minutes": (minutes, (1, 3, 5, 7, 10)),
    "log": (server_log, (4, 10, 18, 28, 39)),
    "reviews": (reviews, (2, 4, 7, 11, 14)),
    "table": (sales_table, (10, 25, 44, 67, 94)),
}


def documents(seed: int = 27) -> list[Document]:
    """The composed documents, in a fixed order (kind by kind, shortest first)."""
    out = []
    for k, (kind, (compose, counts)) in enumerate(COMPOSERS.items()):
        for j, n in enumerate(counts):
            rng = random.Random(seed * 1000 + k * 10 + j)
            out.append(Document(f"{kind}-{j + 1:02d}", kind, compose(rng, n)))
    return out
