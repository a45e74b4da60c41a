"""PII recall and precision of the flywheel's de-identification, per entity type, on planted records.

Generates (seeded) records that plant every entity type the flywheel scrubs in varied phrasings
and formats, plus negatives built to look like them (Luhn-invalid card-like numbers, IBANs with a
wrong checksum, invalid SSNs, git SHAs, UUIDs, dates, version strings, large numbers, capitalised
words that are also census first names, "password"/"token" without a value). Then:

1. span level, per type: recall = planted values found with the right type; removed = planted
   values absent from the scrubbed text whatever type removed them; precision = detections of a
   type that overlap a planted value of that type, over all detections of that type (a detection
   on a negative or on another type's value is a false positive);
2. end to end: the records are written as chat logs, ingested into a pool, and every stored pool
   file (Parquet decoded) is searched for every planted value. Zero card numbers and zero
   secrets must survive (exit 1 otherwise); survivors of other types are printed.

    .venv/bin/python benchmarks/pii_recall.py                # 260 records
    .venv/bin/python benchmarks/pii_recall.py --records 600 --seed 3
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Callable

Span = tuple[str, str]  # (entity type, value)

# Names: common census names and names the census lists lack (recall is measured on both).
FIRST = ["James", "Maria", "Robert", "Linda", "Michael", "Susan", "David", "Karen", "Daniel", "Nancy", "Kevin", "Laura",
         "Priya", "Aarav", "Siobhan", "Mateo", "Ingrid", "Kwame", "Yuki", "Olufemi", "Dana", "Rachel", "Omar", "Fatima"]
LAST = ["Smith", "Johnson", "Garcia", "Miller", "Brooks", "Whitfield", "Patel", "Nakamura", "Okafor", "Schmidt",
        "Rossi", "Novak", "Kowalski", "O'Brien", "Fernandez", "Lindqvist", "Adeyemi", "Hughes", "Reyes", "Chen"]
DOMAINS = ["example.com", "mail.example.org", "corp.example.net", "gmail.com", "outlook.com", "uni.example.edu"]
AREA = [212, 312, 415, 617, 646, 718, 202, 305, 512, 206, 303, 404]


def luhn_digit(body: str) -> str:
    total = 0
    for i, c in enumerate(reversed(body)):
        d = int(c)
        if i % 2 == 0:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return str((10 - total % 10) % 10)


def card(r: random.Random, valid: bool = True) -> str:
    prefix, n = r.choice([("4", 16), ("51", 16), ("55", 16), ("34", 15), ("37", 15), ("6011", 16)])
    body = prefix + "".join(r.choice(string.digits) for _ in range(n - len(prefix) - 1))
    check = luhn_digit(body)
    if not valid:
        check = str((int(check) + r.randint(1, 9)) % 10)
    digits = body + check
    sep = r.choice([" ", "-", ""])
    groups = [digits[:4], digits[4:10], digits[10:]] if n == 15 else [digits[i:i + 4] for i in range(0, 16, 4)]
    return sep.join(groups)


def iban(r: random.Random, valid: bool = True) -> str:
    country, fmt = r.choice([("DE", "n8n10"), ("GB", "a4n6n8"), ("FR", "n10a0n11n2"), ("NL", "a4n10"), ("ES", "n20")])
    bban = ""
    for part in __import__("re").findall(r"[an]\d+", fmt):
        pool = string.ascii_uppercase if part[0] == "a" else string.digits
        bban += "".join(r.choice(pool) for _ in range(int(part[1:])))
    num = int("".join(str(int(c, 36)) for c in bban + country + "00"))
    check = 98 - num % 97
    if not valid:
        check = (check + r.randint(1, 50)) % 97 + 2
    raw = f"{country}{check:02d}{bban}"
    return " ".join(raw[i:i + 4] for i in range(0, len(raw), 4)) if r.random() < 0.6 else raw


def phone(r: random.Random) -> str:
    a, ex, ln = r.choice(AREA), r.randint(201, 999), r.randint(0, 9999)
    while ex == 555:
        ex = r.randint(201, 999)
    return r.choice([f"({a}) {ex}-{ln:04d}", f"{a}-{ex}-{ln:04d}", f"{a}.{ex}.{ln:04d}", f"+1 {a} {ex} {ln:04d}",
                     f"+1-{a}-{ex}-{ln:04d}", f"+44 20 7946 0{r.randint(100, 999)}", f"020 7946 0{r.randint(100, 999)}",
                     f"+49 30 {r.randint(1000000, 9999999)}", f"+33 1 42 {r.randint(10, 99)} {r.randint(10, 99)} "
                     f"{r.randint(10, 99)}"])


def ssn(r: random.Random) -> str:
    area = r.choice([x for x in range(1, 900) if x != 666])
    s = f"{area:03d}-{r.randint(1, 99):02d}-{r.randint(1, 9999):04d}"
    return r.choice([s, s.replace("-", " "), s])


def ip(r: random.Random) -> str:
    if r.random() < 0.7:
        return ".".join(str(r.randint(1, 254)) for _ in range(4))
    groups = [f"{r.randint(0, 0xffff):x}" for _ in range(8)]
    return ":".join(groups) if r.random() < 0.5 else ":".join(groups[:3]) + "::" + groups[7]


def token(r: random.Random, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    while True:
        t = "".join(r.choice(alphabet) for _ in range(n))
        if any(c.isdigit() for c in t) and any(c.isupper() for c in t) and any(c.islower() for c in t):
            return t


def api_key(r: random.Random) -> str:
    kind = r.randrange(10)
    if kind == 0:
        return "sk-proj-" + token(r, 40)
    if kind == 1:
        return "AKIA" + "".join(r.choice(string.ascii_uppercase + string.digits) for _ in range(16))
    if kind == 2:
        return "ghp_" + token(r, 36)
    if kind == 3:
        return "xoxb-" + "-".join(str(r.randint(10 ** 10, 10 ** 11)) for _ in range(2)) + "-" + token(r, 24)
    if kind == 4:
        return "AIza" + token(r, 35, string.ascii_letters + string.digits + "_-")
    if kind == 5:
        return "sk_live_" + token(r, 24)
    if kind == 6:
        return "hf_" + token(r, 34)
    if kind == 7:
        return "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0." + token(r, 43, string.ascii_letters + string.digits + "_-")
    if kind == 8:
        return token(r, 40)  # a bare high-entropy token
    return "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA" + token(r, 64) + "\n-----END RSA PRIVATE KEY-----"


def name(r: random.Random) -> str:
    return f"{r.choice(FIRST)} {r.choice(LAST)}" if r.random() < 0.8 else r.choice(FIRST)


# Each template: (text with {} holes, the entity type of each hole, in order)
TEMPLATES: list[tuple[str, tuple[str, ...]]] = [
    ("Hi, my name is {} and I need help with my order.", ("PERSON",)),
    ("I'm {}; please reach me at {}.", ("PERSON", "EMAIL_ADDRESS")),
    ("Dear {}, thanks for the quick reply.", ("PERSON",)),
    ("Can you draft a letter for {} about the late payment?", ("PERSON",)),
    ("Regards, {}", ("PERSON",)),
    ("Please forward this to {} and cc {}.", ("EMAIL_ADDRESS", "EMAIL_ADDRESS")),
    ("My email is {} if you need anything.", ("EMAIL_ADDRESS",)),
    ("Call me on {} after 5pm.", ("PHONE_NUMBER",)),
    ("My phone number: {}. Text is fine.", ("PHONE_NUMBER",)),
    ("Contact {} at {} or {}.", ("PERSON", "PHONE_NUMBER", "EMAIL_ADDRESS")),
    ("The card {} was charged twice, why?", ("CREDIT_CARD",)),
    ("Pay with my Visa {} exp 09/27.", ("CREDIT_CARD",)),
    ("card number: {}", ("CREDIT_CARD",)),
    ("Wire it to IBAN {} please.", ("IBAN_CODE",)),
    ("Our account {} at the bank.", ("IBAN_CODE",)),
    ("My SSN is {} for the tax form.", ("US_SSN",)),
    ("social security number {}", ("US_SSN",)),
    ("The server at {} keeps timing out.", ("IP_ADDRESS",)),
    ("Block requests from {} and {}.", ("IP_ADDRESS", "IP_ADDRESS")),
    ("Why does my key {} return 401?", ("API_KEY",)),
    ("Here is the config:\napi_key = {}\nregion = eu", ("API_KEY",)),
    ("curl -H 'Authorization: Bearer {}' https://api.example.com", ("API_KEY",)),
    ("This key is leaking in logs: {}", ("API_KEY",)),
    ("{} here: my SSN {} and card {}.", ("PERSON", "US_SSN", "CREDIT_CARD")),
    ("Transfer from {} to {}; confirm by email {}.", ("IBAN_CODE", "IBAN_CODE", "EMAIL_ADDRESS")),
]
GEN: dict[str, Callable[[random.Random], str]] = {
    "PERSON": name, "EMAIL_ADDRESS": lambda r: f"{r.choice(FIRST).lower()}{r.choice(['.', '_', ''])}"
    f"{r.choice(LAST).lower().replace(chr(39), '')}{r.choice(['', str(r.randint(1, 99))])}@{r.choice(DOMAINS)}",
    "PHONE_NUMBER": phone, "CREDIT_CARD": card, "IBAN_CODE": iban, "US_SSN": ssn, "IP_ADDRESS": ip, "API_KEY": api_key}
NEGATIVES: list[Callable[[random.Random], str]] = [
    lambda r: f"Order {card(r, valid=False)} has not shipped yet.",
    lambda r: f"Reference {iban(r, valid=False)} is on the invoice.",
    lambda r: f"Commit {''.join(r.choice('0123456789abcdef') for _ in range(40))} broke the build.",
    lambda r: f"Request id {__import__('uuid').UUID(int=r.getrandbits(128))} failed.",
    lambda r: f"What is {r.randint(100000, 999999)} times {r.randint(100, 999)}?",
    lambda r: f"The meeting moved to 2025-0{r.randint(1, 9)}-1{r.randint(0, 9)} at 10:30.",
    lambda r: f"Upgrade to version v{r.randint(1, 9)}.{r.randint(0, 20)}.{r.randint(0, 20)} today.",
    lambda r: f"The population grew to {r.randint(1, 9)},{r.randint(100, 999)},{r.randint(100, 999)} last year.",
    lambda r: "Will you check whether May or June is better for the launch in Paris?",
    lambda r: "Mark the bug as fixed and Grant access to the Amazon bucket.",
    lambda r: "I forgot my password, how do I reset it? The token count is 512.",
    lambda r: f"Invalid SSN example 000-{r.randint(10, 99)}-{r.randint(1000, 9999)} from the docs.",
    lambda r: f"Use the function snake_case_function_name_for_parsing_config_files_{r.randint(1, 9)} here.",
    lambda r: f"Sort the list [{', '.join(str(r.randint(1, 99)) for _ in range(8))}] ascending.",
]


def make_records(n: int, seed: int) -> list[tuple[str, list[Span]]]:
    r = random.Random(seed)
    out: list[tuple[str, list[Span]]] = []
    n_neg = max(n // 5, 14)
    for i in range(n - n_neg):
        tpl, kinds = TEMPLATES[i % len(TEMPLATES)] if i < len(TEMPLATES) * 4 else r.choice(TEMPLATES)
        values = [GEN[k](r) for k in kinds]
        out.append((tpl.format(*values), list(zip(kinds, values))))
    for i in range(n_neg):
        out.append((NEGATIVES[i % len(NEGATIVES)](r), []))
    r.shuffle(out)
    return out


def _spans(text: str, planted: list[Span]) -> list[tuple[str, int, int]]:
    spans, start = [], 0
    for kind, value in planted:
        i = text.find(value, start)
        spans.append((kind, i, i + len(value)))
        start = i + len(value)
    return spans


def measure(records: list[tuple[str, list[Span]]], deid: object) -> dict[str, Counter]:
    stats: dict[str, Counter] = {}
    for text, planted in records:
        found = deid.analyze(text)
        scrubbed = deid.scrub(text)
        spans = _spans(text, planted)
        for kind, s, e in spans:
            st = stats.setdefault(kind, Counter())
            st["planted"] += 1
            st["found"] += any(f.entity_type == kind and f.start < e and f.end > s for f in found)
            st["removed"] += text[s:e] not in scrubbed
        for f in found:
            st = stats.setdefault(f.entity_type, Counter())
            st["detections"] += 1
            st["true_detections"] += any(k == f.entity_type and f.start < e and f.end > s for k, s, e in spans)
    return stats


def pool_survivors(records: list[tuple[str, list[Span]]], deid: object) -> dict[str, int]:
    import pyarrow.parquet as pq

    from honing.flywheel.ingest import ingest

    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs.jsonl"
        logs.write_text("".join(json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": t}],
                                            "response": "ok", "metadata": {"feedback": "thumbs_up"}}) + "\n"
                                for i, (t, _) in enumerate(records)))
        res = ingest(logs, Path(tmp) / "pool", suites=[], deid=deid)
        stored = "\n".join(json.dumps(pq.read_table(f).to_pylist()) if f.suffix == ".parquet" else f.read_text()
                           for f in sorted(res.pool.rglob("*")) if f.is_file())
    survived: Counter = Counter()
    for _, planted in records:
        for kind, value in planted:
            survived[kind] += value in stored or value.replace("\n", "\\n") in stored
    return {k: survived.get(k, 0) for k in GEN}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=260)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.records < 200:
        ap.error("--records must be at least 200")
    from honing.flywheel.deid import Deidentifier

    deid = Deidentifier()
    records = make_records(args.records, args.seed)
    stats = measure(records, deid)
    n_neg = sum(1 for _, p in records if not p)
    print(f"PII recall on {len(records)} planted records ({n_neg} negatives), seed {args.seed}, "
          f"score threshold {deid.score_threshold}")
    print(f"{'entity':<14} {'planted':>7} {'recall':>7} {'removed':>8} {'detect':>7} {'precision':>9}")
    for kind in GEN:
        st = stats.get(kind, Counter())
        rec = st["found"] / st["planted"] if st["planted"] else float("nan")
        rem = st["removed"] / st["planted"] if st["planted"] else float("nan")
        prec = st["true_detections"] / st["detections"] if st["detections"] else float("nan")
        print(f"{kind:<14} {st['planted']:>7} {rec:>7.3f} {rem:>8.3f} {st['detections']:>7} {prec:>9.3f}")
    survived = pool_survivors(records, deid)
    print("planted values found in stored pool files: " + ", ".join(f"{k} {v}" for k, v in survived.items()))
    leaked = survived["CREDIT_CARD"] + survived["API_KEY"]
    print(f"POOL_LEAKS card_numbers={survived['CREDIT_CARD']} secrets={survived['API_KEY']}")
    if leaked:
        print("FAIL: a card number or secret survived into the pool", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
