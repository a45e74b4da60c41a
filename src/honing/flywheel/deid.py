"""De-identification with Microsoft Presidio, offline.

Presidio's default `AnalyzerEngine()` builds a spaCy NLP engine for `en_core_web_lg` and calls
`spacy.cli.download` when it is missing. Here the engine is spaCy's *blank* English pipeline
(a tokenizer, no weights, nothing to download) plus one component that sets each token's lemma
to its lower-cased text, so Presidio's context enhancer ("ssn", "card", "phone" near a match
raise its score) still works. An installed spaCy NER package can be named instead
(`ner_model=`); it is loaded with `spacy.load` and never downloaded.

Recognizers: Presidio's own for EMAIL_ADDRESS (with an offline domain check), PHONE_NUMBER
(libphonenumber), CREDIT_CARD (Luhn-checked), IBAN_CODE (mod-97 checked), US_SSN and
IP_ADDRESS; honing's for API_KEY and PERSON (see recognizers.py). Every match is replaced by
`<ENTITY_TYPE>` through presidio-anonymizer. A `RedactionReport` counts replacements per entity
type and never holds a matched value.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

ENTITIES = ("EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "US_SSN", "IP_ADDRESS", "API_KEY",
            "PERSON")
DEFAULT_SCORE_THRESHOLD = 0.4  # Presidio's medium SSN pattern and its phone matches score 0.4-0.5
PHONE_REGIONS = ("US", "GB", "DE", "FR", "IN", "CA", "AU", "IE", "NL", "ES", "IT", "BR")
_LEMMA_COMPONENT = "honing_lower_lemma"
# When one detection covers another of a different type, the more specific one wins: checksummed
# and structured formats first, the loose phone matcher late (it also matches SSNs, IBAN digit
# groups, dotted IPs and card fragments). The value is removed either way; this keeps the type
# (and so the report and the placeholder) right.
PRIORITY = {"API_KEY": 0, "EMAIL_ADDRESS": 1, "IBAN_CODE": 2, "CREDIT_CARD": 3, "US_SSN": 4, "IP_ADDRESS": 5,
            "PHONE_NUMBER": 6, "PERSON": 7}


@dataclass
class RedactionReport:
    """How many values of each entity type were replaced, in how many texts. No raw values."""

    counts: Counter = field(default_factory=Counter)
    texts: int = 0
    texts_changed: int = 0

    def add(self, entity_counts: Counter) -> None:
        self.texts += 1
        if entity_counts:
            self.texts_changed += 1
            self.counts.update(entity_counts)

    def merge(self, other: "RedactionReport") -> None:
        self.counts.update(other.counts)
        self.texts += other.texts
        self.texts_changed += other.texts_changed

    def to_json(self) -> dict[str, Any]:
        return {"texts": self.texts, "texts_changed": self.texts_changed,
                "counts": {k: int(v) for k, v in sorted(self.counts.items())}}


def _register_lemma_component() -> None:
    from spacy.language import Language

    if not Language.has_factory(_LEMMA_COMPONENT):
        @Language.component(_LEMMA_COMPONENT)
        def lower_lemma(doc: Any) -> Any:  # the blank pipeline has no lemmatizer
            for tok in doc:
                tok.lemma_ = tok.lower_
            return doc


def _nlp_engine(ner_model: str | None) -> Any:
    """A Presidio SpacyNlpEngine whose `load` never downloads."""
    import spacy
    from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine

    class OfflineSpacyNlpEngine(SpacyNlpEngine):
        def load(self) -> None:
            if ner_model is None:
                _register_lemma_component()
                nlp = spacy.blank("en")
                nlp.add_pipe(_LEMMA_COMPONENT)
            else:
                if not spacy.util.is_package(ner_model):
                    raise RuntimeError(f"spaCy model '{ner_model}' is not installed (honing never downloads one)")
                nlp = spacy.load(ner_model)
            self.nlp = {"en": nlp}

    return OfflineSpacyNlpEngine(models=[{"lang_code": "en", "model_name": ner_model or "blank:en"}],
                                 ner_model_configuration=NerModelConfiguration(labels_to_ignore=[
                                     "CARDINAL", "ORDINAL", "QUANTITY", "MONEY", "PERCENT", "DATE", "TIME"]))


def build_analyzer(ner_model: str | None = None) -> Any:
    """The offline AnalyzerEngine with exactly the recognizers listed in the module docstring."""
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.predefined_recognizers import (CreditCardRecognizer, IbanRecognizer, IpRecognizer,
                                                          PhoneRecognizer, UsSsnRecognizer)

    from honing.flywheel.recognizers import ApiKeyRecognizer, CueNameRecognizer, OfflineEmailRecognizer

    registry = RecognizerRegistry(supported_languages=["en"])
    for rec in (OfflineEmailRecognizer(), PhoneRecognizer(supported_regions=PHONE_REGIONS), CreditCardRecognizer(),
                IbanRecognizer(), UsSsnRecognizer(), IpRecognizer(), ApiKeyRecognizer(), CueNameRecognizer()):
        registry.add_recognizer(rec)
    if ner_model is not None:
        from presidio_analyzer.predefined_recognizers import SpacyRecognizer

        registry.add_recognizer(SpacyRecognizer(supported_entities=["PERSON"]))
    return AnalyzerEngine(registry=registry, nlp_engine=_nlp_engine(ner_model), supported_languages=["en"])


class Deidentifier:
    """Scrubs text (and JSON-like values) of the entities in ENTITIES. Thread-safe; build once
    (Presidio's set-up is the slow part)."""

    def __init__(self, score_threshold: float = DEFAULT_SCORE_THRESHOLD, ner_model: str | None = None) -> None:
        from presidio_anonymizer import AnonymizerEngine

        self.analyzer = build_analyzer(ner_model)
        self.anonymizer = AnonymizerEngine()
        self.score_threshold = score_threshold
        self._lock = threading.Lock()  # spaCy pipelines are not documented as thread-safe

    def scrub(self, text: str, report: RedactionReport | None = None) -> str:
        """`text` with every detected entity replaced by `<ENTITY_TYPE>`."""
        if not text or not text.strip():
            return text
        with self._lock:
            found = self.analyze(text)
            out = self.anonymizer.anonymize(text=text, analyzer_results=found) if found else None
        counts: Counter = Counter(item.entity_type for item in out.items) if out is not None else Counter()
        if report is not None:
            report.add(counts)
        return out.text if out is not None else text

    def analyze(self, text: str) -> list[Any]:
        """Presidio's detections, less those covered by a more specific type (PRIORITY)."""
        found = self.analyzer.analyze(text=text, language="en", entities=list(ENTITIES),
                                      score_threshold=self.score_threshold)
        return [r for r in found if not any(
            o.entity_type != r.entity_type and PRIORITY.get(o.entity_type, 9) < PRIORITY.get(r.entity_type, 9)
            and o.start <= r.start and o.end >= r.end for o in found)]

    def scrub_value(self, value: Any, report: RedactionReport | None = None, depth: int = 0) -> Any:
        """Strings anywhere inside lists and dicts scrubbed; dict keys too (they are user text).
        Past 32 levels the rest is scrubbed as one JSON string (hostile nesting cannot recurse deep)."""
        if depth > 32 and isinstance(value, (list, dict)):
            return self.scrub(json.dumps(value), report)
        if isinstance(value, str):
            return self.scrub(value, report)
        if isinstance(value, list):
            return [self.scrub_value(v, report, depth + 1) for v in value]
        if isinstance(value, dict):
            return {self.scrub(str(k), report): self.scrub_value(v, report, depth + 1) for k, v in value.items()}
        return value

    def scrub_json_text(self, text: str, report: RedactionReport | None = None) -> str:
        """A JSON document given as text: scrubbed value by value when it parses (keeping it valid
        JSON), else as plain text."""
        try:
            return json.dumps(self.scrub_value(json.loads(text), report))
        except (ValueError, TypeError):
            return self.scrub(text, report)


@lru_cache(maxsize=2)
def default_deidentifier(score_threshold: float = DEFAULT_SCORE_THRESHOLD) -> Deidentifier:
    """One Deidentifier per process (and threshold)."""
    return Deidentifier(score_threshold)
