"""honing's own Presidio recognizers, for what Presidio ships none of (or only a networked one).

- `ApiKeyRecognizer` (API_KEY): provider key formats (OpenAI, Anthropic, AWS, GitHub, Slack,
  Google, Stripe, Hugging Face), JWTs, PEM private keys, `key=...`/`Bearer ...` assignments and
  long mixed-case-and-digit tokens of high entropy. Presidio has no secret recognizer.
- `CueNameRecognizer` (PERSON): Presidio finds names only through an NER model, and no official
  spaCy model is a PyPI package (unofficial re-uploads exist; a de-identification step should
  not trust one). Instead: a names list (the US census first/last name files that the `names`
  package ships) plus context cues ("my name is ...", "I'm ...", "Dear ...", "for ...", "Mr. ...",
  sign-offs). Not covered: names outside the census lists without a strong cue, names written
  in lower case without a cue, and non-Latin scripts.
- `OfflineEmailRecognizer`: Presidio's EmailRecognizer validates the domain with `tldextract`,
  whose default fetches the public suffix list from the web on first use; this one reads the
  snapshot bundled with tldextract and never opens a socket.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache
from importlib import resources
from typing import Any, Optional

from presidio_analyzer import EntityRecognizer, Pattern, PatternRecognizer, RecognizerResult
from presidio_analyzer.predefined_recognizers import EmailRecognizer

# --- secrets --------------------------------------------------------------------------------------
_KEY_PATTERNS = [
    ("openai/anthropic", r"\bsk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{20,}", 0.9),
    ("aws access key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b", 0.9),
    ("github token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})", 0.95),
    ("slack token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}", 0.9),
    ("google api key", r"\bAIza[0-9A-Za-z_\-]{30,}", 0.9),
    ("stripe key", r"\b(?:sk|pk|rk)_(?:live|test)_[0-9A-Za-z]{16,}", 0.95),
    ("hugging face token", r"\bhf_[A-Za-z0-9]{30,}", 0.9),
    ("jwt", r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}", 0.9),
    ("pem private key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", 1.0),
    # `api_key = "..."`, `password: ...`, `Authorization: Bearer ...`: the value is secret whatever it looks like
    ("assignment", r"(?i)\b(?:api[_\- ]?key|secret(?:[_\- ]?key)?|access[_\- ]?token|auth[_\- ]?token|token|passw(?:or)?d|"
     r"pwd|client[_\- ]?secret)\b\s*(?:is|[:=])\s*['\"]?[^\s'\"]{8,}", 0.85),
    ("bearer", r"(?i)\bbearer\s+[A-Za-z0-9_\-.=+/]{16,}", 0.85),
    ("high entropy", r"(?<![A-Za-z0-9_\-])[A-Za-z0-9_\-]{32,}(?![A-Za-z0-9_\-])", 0.3),
]


def _entropy(s: str) -> float:
    counts = Counter(s)
    return -sum(c / len(s) * math.log2(c / len(s)) for c in counts.values())


class ApiKeyRecognizer(PatternRecognizer):
    """API keys, tokens and private keys (entity API_KEY)."""

    def __init__(self) -> None:
        super().__init__(supported_entity="API_KEY", name="HoningApiKeyRecognizer",
                         patterns=[Pattern(n, rx, s) for n, rx, s in _KEY_PATTERNS],
                         context=["key", "token", "secret", "password", "api", "credential", "bearer"])

    def validate_result(self, pattern_text: str) -> Optional[bool]:
        # Only the generic long-token pattern needs a check: a git SHA or a hex digest (no upper
        # case) and identifiers like `snake_case_function_names` (low entropy) are not secrets.
        if re.fullmatch(r"[A-Za-z0-9_\-]{32,}", pattern_text) and not re.match(
                r"(?:sk-|AKIA|ASIA|gh[pousr]_|github_pat_|xox|AIza|hf_|(?:sk|pk|rk)_)", pattern_text):
            has = (re.search(r"[a-z]", pattern_text), re.search(r"[A-Z]", pattern_text), re.search(r"\d", pattern_text))
            if not all(has) or _entropy(pattern_text) < 3.5:
                return False
            return True  # raises the weak pattern's score to the maximum
        return None


# --- person names ---------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def name_lists() -> tuple[frozenset[str], frozenset[str]]:
    """(first names, last names), lower-cased, from the census files of the `names` package."""
    def read(fname: str) -> set[str]:
        text = resources.files("names").joinpath(fname).read_text()
        return {line.split()[0].lower() for line in text.splitlines() if line.strip()}

    first = read("dist.male.first") | read("dist.female.first")
    return frozenset(first - _AMBIGUOUS_FIRST), frozenset(read("dist.all.last") - _COMMON_WORDS)


# Census first names that are also everyday words: only a strong cue ("my name is", "Dear")
# makes one of these a name.
_AMBIGUOUS_FIRST = frozenset("""will may june april august major rich grant hope faith joy mark bill sunny summer dean ray
art an so in my me the to do see sue don jack van lane case long young page price carol chance star love guy king
pat penny rose ruby pearl amber iris ivy holly dawn eve autumn winter crystal destiny honey lady baby angel
precious charity grace harmony liberty trinity unique china india paris georgia virginia florida carolina
tom sam ben max jean gene lou ed al ali son sun mon tue wed thu fri sat jan feb mar apr jun jul aug sep oct
nov dec dot else ever fred said tim will""".split())
_COMMON_WORDS = frozenset("""the and for with from this that what when where which who how why please thanks thank hello
hi hey dear help need want total amount number answer question order account card phone email call send
get set run test code data file list item value text name date time year month day week new old good best
first last next more less most very much many some any all none each other same such only just also well
back still even here there then than now today tomorrow yesterday morning evening night note notes issue
bug fix error result results report check sum add minus plus times price cost rate tax fee bank street
city state county park lake hill river north south east west white black green brown gray""".split())

_WORD = r"(?:[A-Z]'[A-Z][a-z]+|[A-Z][a-z]+(?:-[A-Z][a-z]+)?)"  # Smith, O'Brien, Lloyd-Jones
_STRONG = r"(?:my name is|my name's|name\s*:|call me|signed|dear|sincerely|regards|best regards|kind regards|cheers)"
_WEAK = r"(?:i'm|i am|im|this is|for|hi|hello|hey|thanks|thank you|from|ask|cc|attn|contact|with|by|to)"
_TITLE = r"(?:mr|mrs|ms|miss|dr|prof|sir|madam)\.?"
_CUE = re.compile(rf"(?i)\b(?P<cue>{_STRONG}|{_WEAK}|{_TITLE})[,:]?[ \t]+(?-i:(?P<name>{_WORD}(?:[ \t]+{_WORD})?))")
_CUE_LOWER = re.compile(r"(?i)\b(?:my name is|my name's|i'm|i am|call me)[ \t]+(?P<name>[a-z]+(?:[ \t]+[a-z]+)?)\b")
_HERE = re.compile(rf"(?m)(?:^|[.!?]\s+)(?P<name>{_WORD}(?:[ \t]+{_WORD})?)[ \t]+(?:here|speaking|writing)\b")
_PAIR = re.compile(rf"\b(?P<first>{_WORD})[ \t]+(?:[A-Z]\.[ \t]+)?(?P<last>{_WORD})\b")


class CueNameRecognizer(EntityRecognizer):
    """Person names from context cues and the census names lists (entity PERSON)."""

    def __init__(self) -> None:
        super().__init__(supported_entities=["PERSON"], name="HoningCueNameRecognizer", supported_language="en")

    def load(self) -> None:
        name_lists()

    def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None) -> list[RecognizerResult]:
        first, last = name_lists()
        out: list[RecognizerResult] = []

        def add(start: int, end: int, score: float) -> None:
            out.append(RecognizerResult("PERSON", start, end, score,
                                        analysis_explanation=None, recognition_metadata={
                                            RecognizerResult.RECOGNIZER_NAME_KEY: self.name,
                                            RecognizerResult.RECOGNIZER_IDENTIFIER_KEY: self.id}))

        for m in _CUE.finditer(text):
            cue = m.group("cue").lower().rstrip(".")
            toks = m.group("name").split()
            strong = bool(re.fullmatch(_STRONG, cue, re.I) or re.fullmatch(_TITLE, cue + ".", re.I))
            known = toks[0].lower() in first
            # after a weak cue, a known first name, or an unknown one followed by a known surname
            surname = len(toks) > 1 and toks[1].lower() in last
            if not (strong or known or surname):
                continue
            # a second capitalised word is the surname when it is one (or after a strong cue)
            end = m.end("name") if len(toks) > 1 and (toks[1].lower() in last or strong) \
                else m.start("name") + len(toks[0])
            add(m.start("name"), end, 0.85 if strong else 0.7)
        for m in _CUE_LOWER.finditer(text):
            toks = m.group("name").split()
            if toks[0].lower() in first:
                n = len(toks[0]) + (len(toks[1]) + 1 if len(toks) > 1 and toks[1] in last else 0)
                add(m.start("name"), m.start("name") + n, 0.6)
        for m in _HERE.finditer(text):  # "Dana here: ...", "Dana Whitfield speaking"
            toks = m.group("name").split()
            if toks[0].lower() in first or (len(toks) > 1 and toks[1].lower() in last):
                add(m.start("name"), m.end("name"), 0.7)
        for m in _PAIR.finditer(text):  # no cue: a known first name followed by a known surname
            if m.group("first").lower() in first and m.group("last").lower() in last:
                add(m.start(), m.end(), 0.6)
        return out


# --- email without the network ----------------------------------------------------------------------
@lru_cache(maxsize=1)
def _offline_tld() -> Any:
    import tldextract

    # suffix_list_urls=() and no cache: the public suffix list snapshot bundled in the package
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)


class OfflineEmailRecognizer(EmailRecognizer):
    def validate_result(self, pattern_text: str) -> bool:
        return _offline_tld()(pattern_text).fqdn != ""
