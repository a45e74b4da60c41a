"""`finance`: procedurally generated filing-like documents with extraction questions, graded by
the `extract` verifier (honing.verify.finance).

A document has narrative sections (overview, results, liquidity, outlook, notes...), the
income statement, balance sheet and cash-flow statement for several fiscal years (markdown or
plain-text tables under a unit line such as "(in thousands of USD, except per-share data)"),
and distractor numbers (guidance, segments, other years, share counts). The cash-flow statement ends
with the year's opening and ending cash; the ending cash is the balance sheet's cash (and the
opening cash the prior year's), except where a reconciliation question plants a break to catch.
The model answers with one JSON object of named fields: raw values as printed plus a "unit"
field and a "sources" object citing, per raw value, the title of the table it was copied from
(each question names that table; the hidden spec records it as `sections`), derived figures
(growth, margins, ratios) rounded as stated, and cross-checks (the balance sheet balances; the
ending cash reconciles) as true/false with the discrepancy as an amount.

Params: `level` (1..3 or a list; sets the defaults below), `years` (2..5), `distractors`
(0..20), `hops` (1 locate, 2 derived figure, 3 multi-table / cross-check), `doc_sections`
(1..8 narrative sections; >= 2 also prints all three statements), `worked_example` (0/1: show a
solved look-up of another row). Level defaults: 1 = (2 years, 1 distractor, 1 hop, 1 section,
worked example), 2 = (3, 3, 2, 3, none), 3 = (4, 6, 3, 5, none).
Train and held-out tasks come from distinct seed namespaces ("finance/train/<n>" vs "heldout").
"""

from __future__ import annotations

import json
import random
from typing import Any, Callable, Iterator

from honing.errors import TaskError
from honing.tasks.types import SPLITS, Task, VerifierSpec

IS, BS, CF = "CONSOLIDATED STATEMENTS OF OPERATIONS", "CONSOLIDATED BALANCE SHEETS", "CONSOLIDATED STATEMENTS OF CASH FLOWS"
DOC_START, DOC_END = "=== DOCUMENT ===", "=== END DOCUMENT ==="
UNIT_FACTORS = {"thousands": 1_000, "millions": 1_000_000}
# metric -> (statement, row label, is a money amount). Labels are what a reader finds in the tables.
LINE_ITEMS: dict[str, tuple[str, str, bool]] = {
    "revenue": (IS, "Revenue", True), "cost_of_revenue": (IS, "Cost of revenue", True),
    "gross_profit": (IS, "Gross profit", True), "research_and_development": (IS, "Research and development", True),
    "sga": (IS, "Selling, general and administrative", True), "operating_expenses": (IS, "Total operating expenses", True),
    "operating_income": (IS, "Operating income (loss)", True), "interest_expense": (IS, "Interest expense", True),
    "pretax_income": (IS, "Income before income taxes", True), "income_tax": (IS, "Provision for income taxes", True),
    "net_income": (IS, "Net income (loss)", True), "eps": (IS, "Basic earnings per share", False),
    "shares": (IS, "Weighted-average shares outstanding", False),
    "cash": (BS, "Cash and cash equivalents", True), "receivables": (BS, "Accounts receivable, net", True),
    "inventories": (BS, "Inventories", True), "total_current_assets": (BS, "Total current assets", True),
    "ppe": (BS, "Property and equipment, net", True), "goodwill": (BS, "Goodwill", True),
    "total_assets": (BS, "Total assets", True), "accounts_payable": (BS, "Accounts payable", True),
    "accrued_liabilities": (BS, "Accrued liabilities", True),
    "total_current_liabilities": (BS, "Total current liabilities", True),
    "long_term_debt": (BS, "Long-term debt", True), "total_liabilities": (BS, "Total liabilities", True),
    "total_equity": (BS, "Total shareholders' equity", True),
    "cf_net_income": (CF, "Net income (loss)", True), "depreciation": (CF, "Depreciation and amortization", True),
    "working_capital": (CF, "Changes in working capital", True),
    "operating_cash_flow": (CF, "Net cash provided by operating activities", True),
    "capital_expenditures": (CF, "Capital expenditures", True), "acquisitions": (CF, "Acquisitions, net of cash acquired", True),
    "investing_cash_flow": (CF, "Net cash used in investing activities", True),
    "debt_net": (CF, "Proceeds from (repayment of) debt", True), "dividends": (CF, "Dividends paid", True),
    "financing_cash_flow": (CF, "Net cash provided by (used in) financing activities", True),
    "net_change_in_cash": (CF, "Net increase (decrease) in cash and cash equivalents", True),
    "cash_beginning": (CF, "Cash and cash equivalents at beginning of year", True),
    "cash_ending": (CF, "Cash and cash equivalents at end of year", True),
}
# names a reader may cite for a statement in "sources", besides its printed title (compared after
# source_key's normalisation: case, punctuation, plurals and "consolidated"/"the" do not matter)
SOURCE_ALIASES = {IS: ("income statement", "statement of operations", "statement of income"),
                  BS: ("balance sheet", "statement of financial position"),
                  CF: ("cash flow statement", "statement of cash flows")}
# raw metrics a question may ask to locate, with the words used in the question
ASKABLE = {"revenue": "revenue", "gross_profit": "gross profit", "operating_income": "operating income (loss)",
           "net_income": "net income (loss)", "eps": "basic earnings per share", "cash": "cash and cash equivalents",
           "total_current_assets": "total current assets", "total_assets": "total assets",
           "total_liabilities": "total liabilities", "total_equity": "total shareholders' equity",
           "long_term_debt": "long-term debt", "operating_cash_flow": "net cash provided by operating activities"}
# derived metric -> (inputs as (metric, year offset), formula, kind, description); kind: pct | ratio | money
DERIVED: dict[str, tuple[tuple[tuple[str, int], ...], Callable[..., float], str, str]] = {
    "revenue_growth_pct": ((("revenue", 0), ("revenue", -1)), lambda a, b: (a - b) / abs(b) * 100, "pct",
                           "year-over-year revenue growth versus the prior fiscal year"),
    "gross_margin_pct": ((("gross_profit", 0), ("revenue", 0)), lambda a, b: a / b * 100, "pct", "gross profit / revenue"),
    "operating_margin_pct": ((("operating_income", 0), ("revenue", 0)), lambda a, b: a / b * 100, "pct",
                             "operating income (loss) / revenue"),
    "net_margin_pct": ((("net_income", 0), ("revenue", 0)), lambda a, b: a / b * 100, "pct", "net income (loss) / revenue"),
    "current_ratio": ((("total_current_assets", 0), ("total_current_liabilities", 0)), lambda a, b: a / b, "ratio",
                      "total current assets / total current liabilities"),
    "debt_to_equity": ((("long_term_debt", 0), ("total_equity", 0)), lambda a, b: a / b, "ratio",
                       "long-term debt / total shareholders' equity"),
    "return_on_equity_pct": ((("net_income", 0), ("total_equity", 0)), lambda a, b: a / b * 100, "pct",
                             "net income (loss) / total shareholders' equity"),
    "free_cash_flow": ((("operating_cash_flow", 0), ("capital_expenditures", 0)), lambda a, b: a - abs(b), "money",
                       "free cash flow = net cash provided by operating activities minus capital expenditures"),
    "fcf_margin_pct": ((("operating_cash_flow", 0), ("capital_expenditures", 0), ("revenue", 0)),
                       lambda a, b, c: (a - abs(b)) / c * 100, "pct", "free cash flow / revenue"),
    "balances": ((("total_assets", 0), ("total_liabilities", 0), ("total_equity", 0)), lambda a, b, c: a == b + c,
                 "check", "true if total assets equal total liabilities plus total shareholders' equity, else false"),
    "balance_discrepancy": ((("total_assets", 0), ("total_liabilities", 0), ("total_equity", 0)),
                            lambda a, b, c: a - (b + c), "money",
                            "total assets minus (total liabilities + total shareholders' equity); 0 if it balances"),
    "cash_reconciles": ((("cash_ending", 0), ("cash", 0)), lambda a, b: a == b, "check",
                        "true if the cash-flow statement's cash and cash equivalents at end of year equal the "
                        "balance sheet's cash and cash equivalents, else false"),
    "cash_discrepancy": ((("cash_ending", 0), ("cash", 0)), lambda a, b: a - b, "money",
                         "the cash-flow statement's cash and cash equivalents at end of year minus the balance "
                         "sheet's cash and cash equivalents; 0 if they reconcile"),
}
CROSS_CHECKS = {"balances", "balance_discrepancy", "cash_reconciles", "cash_discrepancy"}
QUESTIONS = {2: (("revenue_growth_pct",), ("gross_margin_pct",), ("operating_margin_pct",), ("net_margin_pct",),
                 ("current_ratio",), ("debt_to_equity",)),
             3: (("free_cash_flow", "fcf_margin_pct"), ("return_on_equity_pct",), ("balances", "balance_discrepancy"),
                 ("cash_reconciles", "cash_discrepancy"))}
LEVELS = {1: {"years": 2, "distractors": 1, "hops": 1, "doc_sections": 1, "worked_example": 1},
          2: {"years": 3, "distractors": 3, "hops": 2, "doc_sections": 3, "worked_example": 0},
          3: {"years": 4, "distractors": 6, "hops": 3, "doc_sections": 5, "worked_example": 0}}
KNOB_RANGES = {"years": (2, 5), "distractors": (0, 20), "hops": (1, 3), "doc_sections": (1, 8), "worked_example": (0, 1)}
RULES = {"raw": ("copy amounts exactly as printed in the document (as a JSON number, or as a string with the commas; "
                 "an amount printed in parentheses is negative) and give their unit in \"unit\" (the word from the "
                 "document's unit line); for every amount you copy, give in \"sources\" the title of the table "
                 "you copied it from, as printed"),
         "pct": "percentages are numbers rounded to 1 decimal place (12.3 means 12.3%)",
         "ratio": "ratios are rounded to 2 decimal places", "check": "checks are true or false"}


def rules(fields: dict[str, dict]) -> str:
    """The answer conventions that apply to these fields."""
    kinds = {f.get("format", "raw") for f in fields.values()} | {"raw"}
    return "Rules: " + "; ".join(RULES[k] for k in RULES if k in kinds) + ". Put the JSON object in a ```json code block."


def fmt_amount(v: int | float, dollar: bool = False) -> str:
    """45678 -> '45,678'; -1234 -> '(1,234)'; EPS keeps 2 decimals."""
    s = f"{abs(v):,.2f}" if isinstance(v, float) else f"{abs(v):,}"
    s = ("$" if dollar else "") + s
    return f"({s})" if v < 0 else s


def _financials(rng: random.Random, years: list[int], unit: str) -> dict[int, dict[str, Any]]:
    """One consistent set of statements per year (doc units): the balance sheet balances, and the
    cash-flow statement's ending cash is the balance sheet's cash (its opening cash the prior year's)."""
    rev = rng.randint(20_000, 2_000_000) if unit == "thousands" else rng.randint(400, 60_000)
    cogs_r, rd_r, sga_r = rng.uniform(0.35, 0.7), rng.uniform(0.04, 0.15), rng.uniform(0.08, 0.2)
    shares = max(10, int(rev * rng.uniform(0.005, 0.05)))
    out: dict[int, dict[str, Any]] = {}
    opening: int | None = None
    for y in years:
        rev = max(100, int(rev * rng.uniform(0.9, 1.3)))
        d: dict[str, Any] = {"revenue": rev, "cost_of_revenue": int(rev * (cogs_r + rng.uniform(-0.03, 0.03)))}
        d["gross_profit"] = rev - d["cost_of_revenue"]
        d["research_and_development"] = int(rev * (rd_r + rng.uniform(-0.01, 0.01)))
        d["sga"] = int(rev * (sga_r + rng.uniform(-0.02, 0.02)))
        d["operating_expenses"] = d["research_and_development"] + d["sga"]
        d["operating_income"] = d["gross_profit"] - d["operating_expenses"]
        d["interest_expense"] = int(rev * rng.uniform(0.003, 0.03))
        d["pretax_income"] = d["operating_income"] - d["interest_expense"]
        d["income_tax"] = max(0, int(d["pretax_income"] * rng.uniform(0.15, 0.28)))
        d["net_income"] = d["pretax_income"] - d["income_tax"]
        shares = int(shares * rng.uniform(0.97, 1.03))
        d["shares"], d["eps"] = shares, round(d["net_income"] / shares, 2)
        for k, lo, hi in (("cash", 0.05, 0.4), ("receivables", 0.08, 0.2), ("inventories", 0.02, 0.15),
                          ("ppe", 0.1, 0.6), ("goodwill", 0.0, 0.3), ("accounts_payable", 0.04, 0.12),
                          ("accrued_liabilities", 0.02, 0.08), ("long_term_debt", 0.05, 0.5)):
            d[k] = max(1, int(rev * rng.uniform(lo, hi)))
        # cash is not free: it is the year's opening cash plus the cash flows below (the first year's
        # draw is its opening balance; later draws are discarded so the rest of the stream is unchanged)
        d["cash_beginning"] = opening = d["cash"] if opening is None else opening
        d["cf_net_income"], d["depreciation"] = d["net_income"], max(1, int(d["ppe"] * rng.uniform(0.08, 0.2)))
        d["working_capital"] = int(rev * rng.uniform(-0.05, 0.03))
        d["operating_cash_flow"] = d["net_income"] + d["depreciation"] + d["working_capital"]
        d["capital_expenditures"] = -max(1, int(rev * rng.uniform(0.02, 0.12)))
        d["acquisitions"] = -int(rev * rng.uniform(0.0, 0.1)) if rng.random() < 0.5 else 0
        d["investing_cash_flow"] = d["capital_expenditures"] + d["acquisitions"]
        d["debt_net"], d["dividends"] = int(rev * rng.uniform(-0.05, 0.05)), -int(rev * rng.uniform(0.0, 0.04))
        floor = max(1, int(rev * 0.02))  # a shortfall below the floor is borrowed
        short = floor - (opening + d["operating_cash_flow"] + d["investing_cash_flow"] + d["debt_net"] + d["dividends"])
        d["debt_net"] += max(0, short)
        d["financing_cash_flow"] = d["debt_net"] + d["dividends"]
        d["net_change_in_cash"] = d["operating_cash_flow"] + d["investing_cash_flow"] + d["financing_cash_flow"]
        d["cash"] = d["cash_ending"] = opening = opening + d["net_change_in_cash"]
        d["total_current_assets"] = d["cash"] + d["receivables"] + d["inventories"]
        d["total_assets"] = d["total_current_assets"] + d["ppe"] + d["goodwill"]
        d["total_current_liabilities"] = d["accounts_payable"] + d["accrued_liabilities"]
        d["long_term_debt"] = max(1, min(d["long_term_debt"], int(d["total_assets"] * 0.9) - d["total_current_liabilities"]))
        d["total_liabilities"] = d["total_current_liabilities"] + d["long_term_debt"]
        d["total_equity"] = d["total_assets"] - d["total_liabilities"]
        out[y] = d
    return out


def render_table(title: str, unit_line: str, rows: list[tuple[str, list[str]]], years: list[int],
                 markdown: bool) -> str:
    """A statement as a markdown or fixed-width plain-text table, newest year first."""
    head = f"## {title}\n{unit_line}\n\n"
    cols = [str(y) for y in years]
    if markdown:
        lines = ["| Line item | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
        lines += ["| " + label + " | " + " | ".join(vals) + " |" for label, vals in rows]
    else:
        w = max(len(label) for label, _ in rows) + 2
        lines = [" " * w + "".join(c.rjust(14) for c in cols)]
        lines += [label.ljust(w) + "".join(v.rjust(14) for v in vals) for label, vals in rows]
    return head + "\n".join(lines)


def statement(stmt: str, fin: dict[int, dict[str, Any]], years: list[int], unit: str, markdown: bool) -> str:
    cols = sorted(years, reverse=True)
    unit_line = f"(in {unit} of USD" + (", except per-share data)" if stmt == IS else ")")
    rows = []
    for i, (metric, (st, label, money)) in enumerate((m, v) for m, v in LINE_ITEMS.items() if v[0] == stmt):
        dollar = markdown and money and (i == 0 or label.startswith("Total"))
        vals = [fmt_amount(fin[y][metric], dollar) if metric != "shares" else f"{fin[y][metric]:,}" for y in cols]
        rows.append((label + (" (in " + unit + ")" if metric == "shares" else ""), vals))
    return render_table(stmt, unit_line, rows, cols, markdown)


# --- narrative -----------------------------------------------------------------------------------
_NAMES = ("Norland", "Averon", "Kestrel", "Bluefin", "Corvane", "Halvard", "Ironbridge", "Lumara", "Meridian",
          "Northwind", "Orison", "Pellucid", "Quillon", "Redcliff", "Solace", "Tamarack", "Umbra", "Veridian")
_KINDS = ("Systems", "Holdings", "Technologies", "Industries", "Foods", "Logistics", "Therapeutics", "Networks")
_PRODUCTS = ("industrial sensors", "cloud software", "packaged foods", "freight services", "medical devices",
             "network equipment", "specialty chemicals", "consumer electronics")
_SEGMENTS = ("Americas", "Europe", "Asia Pacific", "Services", "Products", "Enterprise", "Consumer")


class _Doc:
    """What narrative writers need: the company, the years, the figures and a money phrase."""

    def __init__(self, rng: random.Random, company: str, years: list[int], fin: dict, unit: str) -> None:
        self.rng, self.company, self.years, self.fin, self.unit = rng, company, years, fin, unit
        self.last, self.segments = years[-1], rng.sample(_SEGMENTS, 3)

    def money(self, v: int) -> str:
        """An amount in words: exact in the document unit, or rounded one unit up (a unit trap)."""
        if self.rng.random() < 0.5 or abs(v) < 1000:
            return f"${abs(v):,} {self.unit[:-1]}"
        return f"${abs(v) / 1000:,.1f} {'million' if self.unit == 'thousands' else 'billion'}"

    def other(self, v: int) -> int:
        return max(1, int(v * self.rng.choice((self.rng.uniform(0.6, 0.95), self.rng.uniform(1.05, 1.4)))))


def _sections(d: _Doc) -> dict[str, Callable[[], str]]:
    f, y, r = d.fin[d.last], d.last, d.rng
    prev = d.fin[d.years[-2]]
    return {
        "Overview": lambda: (f"{d.company} makes and sells {r.choice(_PRODUCTS)} to customers in {r.randint(5, 60)} "
                             f"countries. It reports three segments: {', '.join(d.segments)}. Its fiscal year ends "
                             f"on December 31."),
        "Results of operations": lambda: (f"Revenue was {d.money(f['revenue'])} in fiscal {y}, compared with "
                                          f"{d.money(prev['revenue'])} in fiscal {y - 1}. Cost of revenue moved with "
                                          f"volume and input prices."),
        "Liquidity and capital resources": lambda: (f"We fund operations from cash on hand and operating cash flow. "
                                                    f"Cash and cash equivalents were {d.money(f['cash'])} at the end "
                                                    f"of fiscal {y}."),
        "Outlook": lambda: ("We expect demand to remain mixed across regions. Our plans assume stable pricing and "
                            "no material acquisitions."),
        "Risk factors": lambda: (f"A {r.randint(5, 20)}% change in foreign exchange rates would change revenue "
                                 f"materially. Supply chain disruption remains a risk."),
        "Employees": lambda: f"We employed {r.randint(200, 40000):,} people at the end of fiscal {y}.",
        "Legal proceedings": lambda: (f"A former distributor claims damages of {d.money(d.other(f['net_income']))}. We "
                                      f"believe the claim is without merit."),
        "Notes to the financial statements": lambda: (
            f"Note 1. Revenue is recognised when control passes to the customer. Note 2. The term loan bears "
            f"interest at {r.uniform(2, 9):.2f}% and matures in {y + r.randint(2, 9)}."),
    }


def _distractors(d: _Doc) -> list[Callable[[], str]]:
    f, y, r, first = d.fin[d.last], d.last, d.rng, d.years[0]
    return [
        lambda: f"At the start of fiscal {y}, management guided to revenue of about {d.money(d.other(f['revenue']))}.",
        lambda: (f"In fiscal {first - 1}, the Company reported revenue of {d.money(d.other(d.fin[first]['revenue']))} "
                 f"and total assets of {d.money(d.other(d.fin[first]['total_assets']))}."),
        lambda: (f"The {d.segments[0]} segment generated revenue of {d.money(d.other(f['revenue'] // 3))} and operating "
                 f"income of {d.money(d.other(max(1, f['operating_income'] // 3)))} in fiscal {y}."),
        lambda: f"As of February {r.randint(1, 28)}, {y + 1}, {d.other(f['shares'] * 1000):,} shares were outstanding.",
        lambda: f"We have a revolving credit facility of {d.money(d.other(f['long_term_debt']))}, undrawn at year end.",
        lambda: f"We expect capital expenditures of {d.money(d.other(-f['capital_expenditures']))} in fiscal {y + 1}.",
        lambda: f"Backlog at the end of fiscal {y} was {d.money(d.other(f['revenue'] // 2))}.",
        lambda: (f"In fiscal {y} we acquired a competitor for {d.money(d.other(f['goodwill'] + 1))}, including "
                 f"{d.money(d.other(f['goodwill'] // 2 + 1))} of goodwill."),
    ]


def _segment_table(d: _Doc, markdown: bool) -> str:
    cols = sorted(d.years, reverse=True)
    rows = [(f"{s} segment revenue", [fmt_amount(d.other(d.fin[c]["revenue"] // 3)) for c in cols]) for s in d.segments]
    return render_table("SEGMENT INFORMATION", f"(in {d.unit} of USD, unaudited)", rows, cols, markdown)


# --- questions -----------------------------------------------------------------------------------
def source_key(name: Any) -> str:
    """A table title or alias as compared: 'CONSOLIDATED BALANCE SHEETS' == 'Balance sheet'."""
    words = "".join(c if c.isalnum() else " " for c in str(name).lower()).split()
    return " ".join(w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words if w not in ("consolidated", "the"))


def _raw_field(metric: str, year: int, fin: dict) -> dict[str, Any]:
    """`sections`: the table the question names; the value must be read there and cited by its title."""
    return {"kind": "raw", "value": fin[year][metric], "money": LINE_ITEMS[metric][2], "rel_tol": 1e-6,
            "abs_tol": 0.0, "sign_free": metric == "capital_expenditures", "sections": [LINE_ITEMS[metric][0]]}


def _derived_field(name: str, year: int, fin: dict) -> dict[str, Any]:
    """`inputs`: the raw fields (asked alongside) it is computed from; `sections`: their tables."""
    inputs, fn, kind, _ = DERIVED[name]
    value = fn(*(fin[year + off][m] for m, off in inputs))
    tol = {"pct": 0.05 + 1e-9, "ratio": 0.005 + 1e-9}.get(kind, 0.0)
    return {"kind": "check" if name in CROSS_CHECKS else "derived", "value": value,
            "money": kind == "money", "rel_tol": 1e-6, "abs_tol": tol, "sign_free": False, "format": kind,
            "inputs": [f"{m}_{year + off}" for m, off in inputs],
            "sections": [s for s in (IS, BS, CF) if any(LINE_ITEMS[m][0] == s for m, _ in inputs)]}


def describe(name: str) -> str:
    """What a field means, in the words the prompt uses."""
    metric, year = name.rsplit("_", 1)
    if metric in DERIVED:
        kind, desc = DERIVED[metric][2], DERIVED[metric][3]
        how = {"pct": "in percent, rounded to 1 decimal place", "ratio": "rounded to 2 decimal places",
               "money": "in the reported unit", "check": "true or false"}[kind]
        return f"{desc}, for fiscal {year} ({how})"
    sign = " (as a positive number)" if metric == "capital_expenditures" else ""
    label = ASKABLE.get(metric, LINE_ITEMS[metric][1].lower())
    return f"{label} for fiscal {year}, as printed in the {LINE_ITEMS[metric][0]}{sign}"


def _questions(rng: random.Random, level: int, hops: int, years: list[int], fin: dict) -> dict[str, dict]:
    """Field name -> field spec (reference value, kind, tolerances)."""
    if hops == 1:
        pairs = rng.sample([(m, y) for m in ASKABLE for y in years], min(level, 3))
        return {f"{m}_{y}": _raw_field(m, y, fin) for m, y in pairs}
    names = rng.choice(QUESTIONS[hops])
    year = rng.choice(years[1:] if "revenue_growth_pct" in names else years)
    if "balances" in names and rng.random() < 0.5:  # plant an inconsistency the question must catch
        fin[year]["total_equity"] += rng.choice((-1, 1)) * rng.randint(1, max(2, fin[year]["total_equity"] // 20))
    if "cash_reconciles" in names and rng.random() < 0.5:  # the cash-flow statement's ending cash, off
        fin[year]["cash_ending"] += rng.choice((-1, 1)) * rng.randint(1, max(2, fin[year]["cash"] // 20))
    fields: dict[str, dict] = {}
    for name in names:
        for m, off in DERIVED[name][0]:
            fields.setdefault(f"{m}_{year + off}", _raw_field(m, year + off, fin))
    for name in names:
        fields[f"{name}_{year}"] = _derived_field(name, year, fin)
    return fields


def _worked_example(rng: random.Random, fields: dict, fin: dict, stmts: list[str], years: list[int],
                    unit: str) -> str:
    """A solved look-up of another row of the same document (the easiest level shows one)."""
    pairs = [(m, y) for m in ASKABLE for y in years if LINE_ITEMS[m][0] in stmts and f"{m}_{y}" not in fields]
    m, y = rng.choice(pairs)
    ex = {f"{m}_{y}": fmt_amount(fin[y][m]), "unit": unit, "sources": {f"{m}_{y}": LINE_ITEMS[m][0]}}
    return (f"Example: asked for {ASKABLE[m]} in fiscal {y}, you would find the row \"{LINE_ITEMS[m][1]}\" of the "
            f"{LINE_ITEMS[m][0]} and the column {y}, and answer:\n```json\n{json.dumps(ex)}\n```\n")


def _answer_template(fields: dict[str, dict]) -> str:
    parts = [f'"{n}": ' + ("<true or false>" if f.get("format") == "check" else "<number>") for n, f in fields.items()]
    if any(f["money"] for f in fields.values()):
        parts.append('"unit": "<unit>"')
    cited = [n for n, f in fields.items() if f["kind"] == "raw"]
    if cited:
        parts.append('"sources": {' + ", ".join(f'"{n}": "<table title>"' for n in cited) + "}")
    return "{" + ", ".join(parts) + "}"


# --- the source ----------------------------------------------------------------------------------
def _int_list(name: str, v: Any, lo: int, hi: int) -> list[int]:
    vals = list(v) if isinstance(v, (list, tuple)) else [v]
    if not vals or any(isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi for x in vals):
        raise TaskError(f"finance: parameter '{name}' must be an integer in {lo}..{hi} (or a list of them), got {v!r}")
    return vals


class FinanceSource:
    domain = "finance"

    def __init__(self, params: dict[str, Any] | None = None, verifier: str | None = None,
                 system_prompt: str | None = None) -> None:
        params = dict(params or {})
        valid = {"level", *KNOB_RANGES}
        unknown = set(params) - valid
        if unknown:
            raise TaskError(f"finance: unknown parameters {sorted(unknown)} (valid: {', '.join(sorted(valid))})")
        self.levels = _int_list("level", params.pop("level", [1, 2, 3]), 1, 3)
        self.overrides = {k: _int_list(k, v, *KNOB_RANGES[k])[0] if k != "hops" else _int_list(k, v, 1, 3)
                          for k, v in params.items()}
        self.verifier = verifier or "extract"
        self.system_prompt = system_prompt

    def make(self, split: str, n: int) -> Task:
        """Task number `n` of `split` (a pure function of both and the params)."""
        rng = random.Random(f"finance/{split}/{n}")
        level = rng.choice(self.levels)
        knobs = {**LEVELS[level], **self.overrides}
        hops = rng.choice(knobs["hops"]) if isinstance(knobs["hops"], list) else knobs["hops"]
        last = rng.randint(2016, 2025)
        years = list(range(last - knobs["years"] + 1, last + 1))
        unit = rng.choice(tuple(UNIT_FACTORS))
        company = f"{rng.choice(_NAMES)} {rng.choice(_KINDS)}, Inc."
        fin = _financials(rng, years, unit)
        fields = _questions(rng, level, hops, years, fin)
        markdown = rng.random() < 0.5
        d = _Doc(rng, company, years, fin, unit)
        pool = _sections(d)
        names = ["Overview"] + rng.sample([k for k in pool if k != "Overview"], knobs["doc_sections"] - 1)
        paras = {k: [pool[k]()] for k in names}
        extra, tables = _distractors(d), []
        for i in range(knobs["distractors"]):
            if i == 2:
                tables.append(_segment_table(d, markdown))
            else:
                paras[rng.choice(names)].append(rng.choice(extra)())
        wanted = {LINE_ITEMS[f.rsplit("_", 1)[0]][0] for f in fields if f.rsplit("_", 1)[0] in LINE_ITEMS}
        stmts = [s for s in (IS, BS, CF) if s in wanted or knobs["doc_sections"] >= 2]
        doc = "\n\n".join([f"# {company} - Annual Report, fiscal {last}"]
                          + [f"## {k}\n" + " ".join(v) for k, v in paras.items()]
                          + [statement(s, fin, years, unit, markdown) for s in stmts] + tables)
        lines = "\n".join(f'- "{name}": {describe(name)}' for name in fields)
        if any(f["money"] for f in fields.values()):
            lines += '\n- "unit": the unit of the amounts you report, as stated in the document'
        if any(f["kind"] == "raw" for f in fields.values()):
            lines += ('\n- "sources": an object giving, for each value you copy from a table, the title of that '
                      'table as printed (the table the field names)')
        example = _worked_example(rng, fields, fin, stmts, years, unit) if knobs["worked_example"] else ""
        text = (f"Read this annual report excerpt and answer from it.\n\n{DOC_START}\n{doc}\n{DOC_END}\n\n"
                f"Report these fields as one JSON object:\n{lines}\n\n{rules(fields)}\n{example}Answer format:\n```json\n"
                f"{_answer_template(fields)}\n```")
        msgs = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        msgs.append({"role": "user", "content": text})
        return Task(id=f"{self.domain}/{split}/{n}", domain=self.domain, prompt=tuple(msgs),
                    verifier=VerifierSpec(self.verifier), hidden={"fields": fields, "unit": unit},
                    difficulty=level / 3, tags=(f"level{level}", f"hops{hops}"),
                    metadata={"level": level, "hops": hops, "seed": n, "years": years, "company": company})

    def tasks(self, split: str, seed: int) -> Iterator[Task]:
        if split not in SPLITS:
            raise TaskError(f"unknown split '{split}' (expected one of {', '.join(SPLITS)})")
        n = seed
        while True:
            yield self.make(split, n)
            n += 1
