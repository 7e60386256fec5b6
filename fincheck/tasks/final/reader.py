"""FINAL's answer reader: a model's answer (a list, JSON, prose, a chain of thought) read as the
descriptions it reports, or as nothing to report, or counted apart when it cannot be read with
confidence. The scoring (`metrics.py`) and the detector read answers through it.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from fincheck.data.sentences import ends_in_abbreviation
from fincheck.io import jsonl
from fincheck.tasks.final.descriptions import split_sentences  # any letter may start one

# How an answer is read (`read_descriptions`). FINAL's judge prompt (the paper's appendix E.4)
# gives an answer that is not a list of descriptions no prediction. The reader reads more
# layouts than that, but never guesses: an answer it cannot read with confidence as a list of
# descriptions or as "nothing to report" gives no description and is counted apart (listed in
# the report), never turned into a description or a confident "none". In order:
#  1. A chain of thought: only what follows its last "Final Output:" (or "Final Answer:") label
#     at the start of a line counts; mid-line, "final output" is the answer's own words.
#  2. A label that opens the answer ("Inconsistencies:", "Answer:", "Output:") is dropped.
#  3. A JSON answer (in a code fence or not: strings, objects with a "description", an object
#     holding such a list) gives the items; a verdict as true or false is read by its key
#     ("consistent": true is nothing to report; "hallucination": true with one explanation,
#     that explanation).
#  4. Marked items (lettered, numbered, bulleted lines) are the descriptions; an item that
#     reports no problem ("None", "No errors in the date.", "The date is supported by the
#     text.") is dropped; a preamble before the first item and a closing paragraph after a blank
#     line are not items; nor is a tally ("Total inconsistencies: 2"). An item whose only
#     report is a negation governing a word that names an error ("I couldn't spot a single
#     inconsistency") may deny it: the answer is counted apart, never flagged. A list none of
#     whose items names a problem or the texts compared is read but counted as not in the
#     asked-for format. An item whose last sentence affirms what it said ("... This is
#     consistent.") is counted apart, as is a list under a verdict of nothing (a heading line
#     such as "Explanation:" between them is no part of the verdict).
#  5. Unmarked prose: its sentences that report no problem (an omission remarked on included:
#     leaving something out is not unsupported information; a claim the next sentence affirms)
#     are dropped; if nothing else is left the answer is "nothing to report" ("None. The
#     summary is fully supported by the text."), unless it only affirms "the rest", else it
#     gives no description and is counted apart. Two clauses that say what each text states
#     compare them: a report.
# Before these: `$\boxed{None}$` reads as `None`; an answer with no English words (another
# language) is counted apart; a table reads as "nothing to report" only when every row affirms
# its claim, else it is counted apart; a list of markers with no text is counted apart. In a
# list, check-marked items (✅ ✓, anywhere in the item) are affirmations, crossed ones (❌ ✗)
# reports, an arrowed verdict ("→ Supported") is a clause of its own, indented sub-items and
# (in a lettered or numbered list) markers of another kind continue their item, and "A. ...
# B. ..." or "1) ... 2) ..." on one line are two items (counted apart when the next marker
# follows an abbreviation: "Sen. B. Harris").

# "A. text", "A) text", "(A) text", "- A. text", "**A.** text", "1. text", "ii. text", "- text",
# "### 1. text", "Inconsistency 1: text"; a marker alone on its line ("A.") opens an item whose
# text follows (the paper's few-shot layout). A marker is one letter, two capitals or a small
# roman numeral: "No.", "Mr." and "Dr." open no item.
_ITEM = re.compile(
    r"^\s*(?:#{1,6}\s*)?(?:[-*•]\s*)?(?:\*\*)?\(?(?:(?-i:[A-Z]{2}|[ivx]{2,4})|[A-Z]|\d{1,3})[.):]"
    r"(?:\*\*)?"
    r"(?:\s+(?P<lettered>.+))?$"
    r"|^\s*(?:[-*•]\s+|[✅✔✓☑❌✗✘❎]\s*)(?P<bullet>.+)$"
    r"|^\s*(?:\*\*)?(?:inconsistenc(?:y|ies)|issue|error|problem|claim|statement)\s+\d{1,3}\s*(?:\*\*)?"
    r"\s*[:.)](?:\*\*)?\s*(?P<named>.+)$",
    re.IGNORECASE,
)
# The CoT prompts ask for the answer under "Final Output:" (FINAL paper, appendix B.1 / E.2.3);
# models also write "Final Answer:". Only as a label: at the start of a line, then a colon or
# the end of the line ("**Final Output:**", "## Final Output").
_FINAL_LABEL = re.compile(
    r"^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*)?final[ \t]+(?:output|answer)[ \t]*(?:\*\*)?"
    r"(?::(?:\*\*)?|[ \t]*$)",
    re.IGNORECASE | re.MULTILINE,
)
# A label that introduces the answer: "Inconsistencies:" (the layout the few-shot prompts
# teach: "Inconsistencies:\nNone"), "Factual inconsistencies found:", "Answer:", "Output:".
_LABEL = (
    r"[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*)?(?:(?:factual[ \t]+)?inconsistenc(?:y|ies)(?:[ \t]+found)?"
    r"|answer|output)(?:\*\*)?(?:[ \t]*:(?:\*\*)?[ \t]*|[ \t]*(?=\n|$))"
)
_ANSWER_LABEL = re.compile(rf"\s*{_LABEL}", re.IGNORECASE)
# The same label later in the answer, at a line's start: what came before it (the summary's
# claims listed, an analysis) is not the answer ("Claims:\n1. ...\n\nInconsistencies:\nNone").
_LATER_LABEL = re.compile(rf"^{_LABEL}", re.IGNORECASE | re.MULTILINE)
_DESCRIPTION_LABEL = re.compile(r"^\s*(?:\*\*)?description(?:\*\*)?\s*:\s*", re.IGNORECASE)
_DECORATION = "*#\"'`\u201c\u201d \n"

# --- clauses that report no problem ------------------------------------------------------
# A clause is what lies between ; , : ( ) dashes. It reports no problem when it is "None" (or
# "Nothing to report"), says there is no error, or affirms a detail without any negation.
_NONE = re.compile(
    r"(?:there\s+(?:are|is|were)\s+)?"
    r"(?:none|n/a|nil|nothing)(?:\s+(?:found|identified|detected|noted|reported|to report"
    r"|to flag))?",
    re.IGNORECASE,
)
# (at most three words before it: a pattern searched at every word may not scan a whole run of
# "factual factual ..." from each, which takes quadratic time)
_PROBLEM = (
    r"(?:(?:factual|significant|other|major|minor|notable|apparent|obvious)\s+){0,3}"
    r"(?:inconsistenc\w*|errors?|issues?|problems?|hallucinations?|mistakes?|discrepanc\w*|"
    r"inaccurac\w*|unsupported\s+\w+|contradictions?)"
)
# What a double negative denies ("nothing wrong", "none of them unsupported").
_NEGATED_ERROR = (
    r"(?:unsupported|wrong|incorrect|inconsistent|inaccurate|false|invented|made\s+up|fabricated"
    r"|contradicted|contradictory|unverified|unverifiable|erroneous|mistaken|misleading"
    r"|hallucinated|problematic|amiss|off)"
)
_NO_PROBLEM = re.compile(
    rf"(?:(?:i|we)\s+(?:have\s+)?(?:found|find|see|detected|identified|noticed|could\s+find)"
    rf"|there\s+(?:are|is|were|was|appear\s+to\s+be|seem\s+to\s+be)(?:\s*n't|\s+not)?"
    rf"|(?:the\s+)?summary\s+(?:contains|has|includes|makes|shows)"
    rf"|(?:the\s+)?summary\s+(?:does\s+not|doesn't)\s+(?:contain|have|include|make|show)"
    rf"|(?:i|we)\s+(?:do|did|could|can|cannot|can't|couldn't|didn't|don't)\s*(?:not\s+)?"
    rf"(?:find|see|identify|detect|spot))?"
    rf"\s*(?:no|any)\s+{_PROBLEM}\b.*"
    rf"|(?:the\s+)?summary\s+(?:is|seems|appears|looks)\s+(?:to\s+be\s+)?"
    rf"(?:(?:fully|entirely|completely|factually|wholly|well|generally|largely|mostly)\s+)*"
    rf"(?:consistent|supported|accurate|faithful|correct|grounded|verified|verifiable)\b.*"
    rf"|(?:all|every|each|everything)\b.*?\b(?:is|are)\s+(?:\w+\s+)?"
    rf"(?:supported|consistent|accurate|correct|verified|verifiable|grounded)\b.*"
    # a double negative: "None of the claims are unsupported", "Nothing wrong with the date",
    # "No detail is made up", "Not a single claim is incorrect"
    rf"|(?:(?:there\s+(?:is|are|was|were)|(?:i|we)\s+(?:\w+\s+)?(?:see|saw|find|found|notice"
    rf"|noticed))\s+)?(?:none\s+of\s+(?:the\s+|its\s+|these\s+|this\s+)?\w+(?:\s+\w+)?|nothing"
    rf"|no\s+(?:\w+\s+)?(?:claims?|details?|facts?|statements?|information|parts?|pieces?)"
    rf"|not\s+(?:a\s+single|one|any)\s+\w+)"
    rf"(?:\s+(?:in|of)\s+(?:the\s+)?(?:summary|text|answer))?"
    rf"\s+(?:(?:is|are|was|were|seems?|appears?|looks?)\s+(?:to\s+be\s+)?)?"
    rf"(?:(?:at\s+all|really|actually|in\s+any\s+way)\s+)?{_NEGATED_ERROR}\b.*"
    rf"|(?:the\s+)?(?:text|summary)\s+and\s+(?:the\s+)?(?:text|summary)\s+"
    rf"(?:are\s+identical|match|agree|are\s+consistent)\b.*"
    rf"|(?:(?:the\s+)?summary|everything|it|all|this)\s+(?:\w+\s+)?checks?\s+out\b.*"
    rf"|(?:i|we)\s+(?:could\s*not|couldn't|did\s*not|didn't|cannot|can't|do\s+not|don't)\s+"
    rf"(?:find|see|identify|spot|detect)\s+any\s+(?:claims?|statements?|information|details?)"
    rf"\b.*?\b(?:beyond|unsupported|not\s+supported|not\s+in)\b.*"
    rf"|(?:supported|consistent|correct|accurate|verified|confirmed|true|verifiable)",
    re.IGNORECASE,
)
# A whole sentence that says there is nothing to report in a way the clauses cannot tell
# (they are read one by one): a problem label with no count ("Unsupported claims: none",
# "Hallucinations: 0"), "free of errors", "error-free", "zero inconsistencies", "not a single
# error", double negatives ("The date is not incorrect", "No claim lacks support", "The summary
# never contradicts the text", "... doesn't contain anything not found in the text").
_SAYS_NONE = re.compile(
    rf"(?:{_PROBLEM}|hallucinated\s+\w+)(?:\s+(?:found|detected|identified))?\s*[:=]\s*"
    rf"(?:none|0|zero|no|nil|n/a|nothing)(?:\s+(?:found|detected|identified))?"
    rf"|(?:the\s+)?summary\s+(?:is|seems|appears|looks)\s+(?:to\s+be\s+)?"
    rf"(?:(?:entirely|completely|fully|totally)\s+)?"
    rf"(?:free\s+(?:of|from)\s+(?:any\s+)?{_PROBLEM}|(?:error|mistake|hallucination)-free)"
    rf"|(?:zero|0)\s+{_PROBLEM}(?:\s+(?:were\s+|was\s+)?(?:found|identified|detected|noted))?"
    rf"|not\s+applicable"
    rf"|(?:there\s+(?:isn't|is\s+not|aren't|are\s+not)\s+(?:a\s+single|one|any)"
    rf"|not\s+(?:a\s+single|one))\s+{_PROBLEM}"
    rf"(?:\s+in\s+(?:the\s+)?summary)?(?:\s+(?:was|were)\s+found)?"
    rf"|(?:the\s+)?summary\s+never\s+(?:contradicts|misstates|misrepresents|distorts)\s+"
    rf"(?:the\s+)?(?:text|article|source|document)"
    rf"|(?:the\s+)?summary\s+neither\s+adds\s+nor\s+(?:changes|alters|distorts|invents)"
    rf"(?:\s+any)?\s+(?:facts?|details?|information|claims?)"
    rf"|(?:no|none\s+of\s+the)\s+(?:claims?|details?|facts?|statements?)"
    rf"(?:\s+in\s+the\s+summary)?\s+lacks?\s+(?:support|grounding|evidence)"
    rf"|(?:the\s+)?summary\s+(?:does\s+not|doesn't)\s+(?:contain|include|say|state|add)\s+"
    rf"anything\s+(?:that\s+is\s+)?not\s+(?:found\s+|stated\s+|supported\s+|mentioned\s+)?"
    rf"(?:in|by)\s+the\s+(?:text|article|source|document)"
    # a double negative about a detail named with a determiner ("The date is not incorrect";
    # never "Only the date is not wrong", "Few claims are not fabricated")
    rf"|(?:the|this|that|these|those|each|every|its|their)\s+"
    rf"(?:(?!(?:alone|only|just|first|last|remaining|other|rest|few)\b)\w+\s+){{0,2}}"
    rf"(?:is|are|was|were)\s+not\s+(?:at\s+all\s+)?{_NEGATED_ERROR}",
    re.IGNORECASE,
)
# A detail affirmed: "The date is supported by the text", "the summary correctly states ...".
_TEXTS = r"(?:text|article|source|original|document|passage)"
_AFFIRMS = re.compile(
    rf"\b(?:is|are|was|were)\s+(?:\w+ly\s+|also\s+|all\s+|both\s+)*"
    rf"(?:supported|consistent|accurate|correct|verified|confirmed|right|fine|true|backed)\b"
    rf"|\b(?:correctly|accurately|rightly|faithfully)\s+\w+"
    rf"|\b(?:match(?:es)?|agrees?\s+with|(?:is|are)\s+in\s+line\s+with)\s+the\s+{_TEXTS}\b"
    rf"|\b(?:appears?|(?:is|are)\s+(?:both\s+|also\s+)?(?:stated|mentioned|given|found|reported))"
    rf"\s+in\s+the\s+{_TEXTS}\b"
    rf"|\bthe\s+{_TEXTS}\s+(?:confirms|supports)\s+(?:this|that|it)\b(?!')"
    # "..., which the text confirms", "which paragraph two also states", "The text agrees",
    # "the text also says two", "gets the date right", "both give the score as 2-1"
    rf"|\b(?:which|as)\s+(?:the\s+)?(?:{_TEXTS}|paragraph\s+\w+)\s+(?:also\s+)?"
    rf"(?:confirms|supports|states|says|reports|mentions|gives|shows)\b"
    rf"|\bthe\s+{_TEXTS}\s+(?:agrees|concurs|also\s+(?:says|states|gives|reports|mentions))\b"
    rf"|\bgets?\s+(?:\w+\s+){{0,3}}right\b|\bboth\s+(?:give|say|state|report|put)\b"
    rf"|\b(?:is|are)\s+(?:\w+\s+)?(?:the\s+)?same\s+as\b|\bidentical\s+to\b|\bin\s+line\s+with\b"
    rf"|\bword\s+for\s+word\b|\bso\s+does\s+the\s+{_TEXTS}\b|\blines?\s+up\s+with\b"
    rf"|\b(?:is|are)\s+(?:also\s+)?(?:present|found|contained)\s+in\s+the\s+(?:\w+\s+)?{_TEXTS}\b"
    rf"|\bthe\s+{_TEXTS}\s+(?:says|states|gives)\s+(?:this|so|the\s+same)(?:\s+too)?\b"
    rf"|\baccurately\b|\bbacked\s+up\s+by\b"
    rf"|\bmatch(?:es)?\s+(?:the\s+)?(?:paragraph|sentence|line)\s+\w+"
    rf"|\b(?:is|are)\s+(?:taken\s+from\s+the\s+{_TEXTS}|what\s+the\s+{_TEXTS}\s+(?:says|states|gives))\b"
    # a verdict clause of its own: "consistent with the source", "Supported by the first
    # paragraph", "matches", "OK", "same as the text"
    rf"|^(?:fully\s+|entirely\s+|completely\s+)?(?:consistent|accurate|correct|supported"
    rf"|confirmed|verified|matches|matching|agrees)(?:\s+(?:with|by|in|to)\s+[\w' ]{{1,40}})?$"
    rf"|^(?:the\s+)?(?:same\s+as|identical\s+to|taken\s+from|as\s+in|found\s+in|present\s+in"
    rf"|backed\s+up\s+by)\s+[\w' ]{{1,40}}$|^ok(?:ay)?$|^identical\b[\w' ]{{0,30}}$"
    rf"|\bhas\s+the\s+same\b",
    re.IGNORECASE,
)
# A clause that says what one of the texts states ("the summary says 2am", "the text gives
# 12,000"): two of them in one sentence compare the texts, which reports a difference.
_CLAIM = re.compile(
    rf"\b(?:summary|{_TEXTS})\s+(?:says|said|states|stated|gives|gave|reports|claims|puts|lists"
    rf"|mentions|writes|calls|describes|has)\b",
    re.IGNORECASE,
)
# An affirmation of "the rest": in an answer of its own it implies something else was reported
_THE_REST = re.compile(
    r"\b(?:the\s+rest|everything\s+else|all\s+else|otherwise|other\s+(?:details?|facts?|claims?"
    r"|information|parts?)|remaining\s+\w+)\b",
    re.IGNORECASE,
)
# Words that name an error ("wrong", "invented", "unsupported").
_ERROR_WORDS = (
    r"incorrect\w*|wrong\w*|false\w*|contradict\w*|invent\w*|fabricat\w*|hallucinat\w*|"
    r"mislead\w*|misstat\w*|misrepresent\w*|inaccura\w*|inconsisten\w*|unsupported|"
    r"unverifi\w*|errors?|mistak\w*|differ\w*|discrepan\w*|"
    # DeFacto's own wording of an invented detail ("It makes up his first name": 202 of the
    # prepared targets) and of a twisted one
    r"mak\w*\s+up|made\s+up|misinterpret\w*|misidentif\w*|misquot\w*|misattribut\w*|"
    r"exaggerat\w*|overstat\w*|understat\w*|distort\w*|twist\w*"
)
# Words that turn a clause into a report: a negation, a contrast, an error named.
_REPORTS = re.compile(
    r"\bnone\s+of\b|\bnothing\b|"
    r"\b(?:not|never|nor|no|without|n't|cannot|instead|rather|only|but|however|except|although|"
    r"though|whereas|yet|unclear|unstated|unmentioned|absent|missing|aside|exception|"
    rf"{_ERROR_WORDS})\b|n't\b",
    re.IGNORECASE,
)
_CLAUSE_SPLIT = re.compile(r"[;,:()\u2013\u2014\u2192]|\s-\s|\s=?->?\s")
_CONTRAST = re.compile(
    r"\b(?:but|however|except|exception|although|though|whereas|yet|apart from|aside from"
    r"|other than|save for)\b",
    re.IGNORECASE,
)


# What makes an affirmation partial ("Everything is correct bar the year"): the contrast words
# and the exceptions, checked only where a clause would otherwise report nothing
_EXCEPT = re.compile(
    rf"{_CONTRAST.pattern}|\b(?:bar|barring|excluding|besides|save|beyond|aside|while|only|just)\b",
    re.IGNORECASE,
)
# A connective before a verdict ("so there are no inconsistencies")
_LEAD = re.compile(r"^(?:so|therefore|thus|hence|overall|in\s+short|in\s+conclusion)\s+", re.I)


def _plain(clause: str) -> str:
    return clause.strip(_DECORATION + ".!").strip()


# A clause saying what the summary does ("the summary places", "the summary inflates"), not one
# naming a detail of it ("the summary's date")
_SUMMARY_DOES = re.compile(r"\bsummary\s+(?!(?:is|was|has|and|as|its)\b)\w{2,}(?:s|ed)\b", re.I)
# Where in a text a verdict points ("(paragraph 2)"): nothing said of its own
_LOCATOR = re.compile(r"(?:paragraph|para|line|sentence|section)\s+\w+", re.IGNORECASE)
_SAME = re.compile(r"\b(?:the\s+same|too|also|as\s+well)\b", re.IGNORECASE)
# An affirmation of what came just before it ("which the text confirms", "this is correct")
_REFERS_BACK = re.compile(r"(?:which|this|that|as|it|so|and\s+(?:this|that|it))\b", re.IGNORECASE)


def _clause_kind(clause: str) -> str:
    """ "nothing" (reports no problem), "report" (a negation, contrast or problem word) or
    "neutral" (neither: "The location", "After checking each statement")."""
    plain = _plain(clause)
    if not plain or plain.lower() in ("no", "yes"):  # "No, the summary does not contain ..."
        return "neutral"
    verdict = _LEAD.sub("", plain)  # "so there are no inconsistencies"
    says_none = _NONE.fullmatch(verdict) or _NO_PROBLEM.fullmatch(verdict)
    if not says_none and _REPORTS.search(plain):
        return "report"
    if says_none or _AFFIRMS.search(plain):  # "while dates and names are accurate": partial
        return "report" if _EXCEPT.search(plain) else "nothing"
    return "neutral"


# A remark on what the summary leaves out ("it omits the second vote, but omissions aren't
# inconsistencies"): leaving something out is no unsupported information.
_OMISSION = re.compile(r"\b(?:omit\w*|omission\w*|leaves?\s+out|left\s+out)\b", re.IGNORECASE)
_NOT_AN_ERROR = re.compile(
    r"\b(?:is|are|was|were)(?:\s*n't|\s+not)\s+(?:an?\s+)?(?:inconsistenc\w*|errors?|problems?)",
    re.IGNORECASE,
)


def _sentence_says_nothing(sentence: str) -> bool:
    """A clause that reports no problem, only lead-ins before it ("After checking each
    statement, I found no errors", "The location (Leeds) is correct") and nothing after it
    but clauses that report no problem either; or a remark on an omission alone."""
    if _OMISSION.search(sentence) and not _NAMES_AN_ERROR.search(_NOT_AN_ERROR.sub("", sentence)):
        return True
    if _SAYS_NONE.fullmatch(_plain(sentence)) and not _EXCEPT.search(sentence):
        return True
    clauses = _CLAUSE_SPLIT.split(sentence)
    kinds = [_clause_kind(clause) for clause in clauses]
    if "nothing" not in kinds or "report" in kinds:
        return False
    neutral = " ; ".join(c for c, kind in zip(clauses, kinds, strict=True) if kind == "neutral")
    if len(_CLAIM.findall(neutral)) > 1:  # "the summary says 2am, the text says 4am, the rest
        return False  # is correct": a comparison, which reports a difference
    first = kinds.index("nothing")
    before = [c for c in clauses[:first] if _plain(c)]
    # what the summary does, then an affirmation of other details ("The summary places it in
    # Leeds; the crowd size is correct", "...; everything else is correct"): a report; an
    # affirmation that refers back to it ("..., which the text confirms") is none
    verdict = _plain(clauses[first])
    if before and _THE_REST.search(verdict):
        return False
    if before and any(_SUMMARY_DOES.search(c) for c in before):  # a bare verdict ("- correct")
        back = _REFERS_BACK.match(verdict) or _SAME.search(verdict)
        return bool(back) or len(verdict.split()) <= 3  # refers back too
    # lead-ins before the first no-problem clause, and neutral pieces of an enumeration after
    # it ("all names, dates and figures match the text"), as long as it ends on one
    said = [(k, c) for k, c in zip(kinds, clauses, strict=True) if _plain(c)]
    last = [kind for kind, clause in said if not _LOCATOR.fullmatch(_plain(clause))][-1]
    return last == "nothing"


def says_nothing(text: str) -> bool:
    """Whether a piece of an answer (the whole answer, an item, a sentence) reports no problem:
    "None", "None. The summary is fully supported by the text.", "No errors in the date.",
    "I found no inconsistencies.", "The date is supported by the text." Every sentence must say
    so, and no clause report a problem: "No errors in the date; the name 'John' is invented."
    reports one."""
    text = _unquoted(text.strip("*#` \n"))
    text = re.sub(r"^no\s*[.!]\s+(?=\S)", "", text, flags=re.IGNORECASE)  # "No. It is consistent."
    sentences = split_sentences(" ".join(text.split()))
    says = [_sentence_says_nothing(sentence) for sentence in sentences]
    following = [*zip(sentences[1:], says[1:], strict=True), ("", False)][: len(sentences)]
    return all(
        nothing or _claim_then_verdict(sentence, *after)
        for sentence, nothing, after in zip(sentences, says, following, strict=True)
    )


def _unquoted(text: str) -> str:
    """The text without the quotes around all of it: a quote that opens its first sentence only
    ("\"Three people were injured\" - the text says so.") stays."""
    quotes = "\"'\u201c\u201d"
    if text[:1] in quotes and text[-1:] in quotes and not any(q in text[1:-1] for q in quotes):
        return text[1:-1].strip()
    return text.strip()


# An item that only says the answerer does not know
_HEDGE = re.compile(
    r"(?:i'?m\s+)?(?:not\s+sure|unsure|uncertain|unclear|(?:i\s+)?(?:can(?:not|'t)|could\s*n[o']t)"
    r"\s+tell|(?:i\s+)?don'?t\s+know)\W*",
    re.IGNORECASE,
)


def _closing_says_none(text: str) -> bool:
    """The answer's last paragraph, after a list, says there is nothing to report ("Therefore,
    there are no inconsistencies."): the items above it were the summary's claims, checked."""
    paragraphs = re.split(r"\n[ \t]*\n", text.strip())
    closing = paragraphs[-1] if len(paragraphs) > 1 else ""
    if not closing or any(_ITEM.match(line) for line in closing.splitlines()):
        return False
    further = re.search(
        r"\b(?:other|further|more|additional|else|remaining|otherwise)\b", closing, re.I
    )
    return bool(re.search(_PROBLEM, closing, re.I)) and not further and says_nothing(closing)


_HEADING = re.compile(r"[ \t#*]*\w+(?:[ \t]+\w+){0,2}[ \t*]*:[ \t*]*")  # "**Explanation:**"


def _opening_says_none(text: str) -> bool:
    """What stands before the list's first marker says there is nothing to report ("None",
    "No inconsistencies."): the items after it contradict the answer's own verdict."""
    opening = []
    for line in text.splitlines():
        if _ITEM.match(line):
            break
        if not _HEADING.fullmatch(line):  # "Explanation:" introduces the list; no verdict
            opening.append(line)
    opening_text = " ".join(" ".join(opening).split())
    named = _leads_with_none(opening_text + "\n") or re.search(_PROBLEM, opening_text, re.I)
    return bool(opening_text and named and says_nothing(opening_text))


# A line that starts another example of a few-shot prompt ("Example 4"): a model that answered
# and went on writing examples of its own; its answer ends there.
_NEW_EXAMPLE = re.compile(r"^[ \t*#]*example[ \t]+\d+[ \t*:]*$", re.IGNORECASE | re.MULTILINE)


def _until_a_new_example(text: str) -> str:
    """The answer before a new example it goes on to write (not when the answer opens with
    one: then the rules below find its own answer after it)."""
    for match in _NEW_EXAMPLE.finditer(text):
        if text[: match.start()].strip():
            return text[: match.start()]
    return text


def _claim_then_verdict(claim: str, verdict: str, says_nothing: bool) -> bool:
    """A sentence that only says what one text states, affirmed by the next ("The summary says
    the fire started at 3am. The text agrees."); not when the next affirms "the rest"."""
    return bool(
        says_nothing
        and not _THE_REST.search(verdict)
        and len(_CLAIM.findall(claim)) == 1
        and all(_clause_kind(clause) == "neutral" for clause in _CLAUSE_SPLIT.split(claim))
    )


# What an explanation after a leading "None" may not say ("None (the summary only restates the
# first paragraph)" is nothing to report; "None, but the year is wrong" is not).
_NAMES_AN_ERROR = re.compile(
    rf"\b(?:{_ERROR_WORDS}|not\s+(?:supported|stated|mentioned|in\s+the\s+text))\b",
    re.IGNORECASE,
)
_COMPARED = re.compile(r"\b(?:summary|text|source|article|document|passage|original)\b", re.I)


# A negation next to a word that names an error, which may deny it ("The date isn't wrong",
# "Neither the date nor the name is invented", "It contains nothing false"), the shapes the
# rules above do not read with confidence: a list holding one is counted apart.
_DOUBLE_NEGATIVE = re.compile(
    rf"\b(?:(?:is|are|was|were)(?:n't|\s+not)|never|nothing(?:'s)?|anything|neither\b[^.]{{0,200}}?\bnor)"
    rf"\s+(?:(?:\w+\s+){{0,3}}(?:is|are|was|were)\s+)?(?:\w+\s+)?{_NEGATED_ERROR}\b"
    rf"|\bnone\s+of\s+the\s+\w+\s+(?:is|are|was|were)\s+{_NEGATED_ERROR}\b",
    re.IGNORECASE,
)


# A negation that governs a word naming an error within one clause, with no verb of support
# between them ("There's no inconsistency", "I haven't found any errors", "does not contradict
# the text", "zero unsupported claims", "inconsistency-free"); "The text does not mention that
# he made it up" is no denial (the negation governs "mention").
_DENIED = (
    rf"{_PROBLEM}|{_NEGATED_ERROR}|contradict\w*|misstat\w*|misrepresent\w*|invent\w*"
    rf"|fabricat\w*|hallucinat\w*|mislead\w*|mak\w*\s+up|distort\w*|exaggerat\w*|incorrect\w*"
    rf"|inaccura\w*|wrong\w*|false\w*|conflict\w*|deviat\w*|disagree\w*"
)
_DENIAL = re.compile(
    rf"(?:\b(?:no|not|never|nothing|none|zero|without|neither|nor)\b|n't)"
    rf"(?:\s+(?!(?:mention\w*|say\w*|said|state\w*|support\w*|includ\w*|contain\w*|indicat\w*|confirm\w*"
    rf"|specif\w*|give\w*|given|back\w*|correct\w*|accurat\w*|true|right\w*|consistent\w*"
    rf"|valid\w*|faithful\w*|present|because|since|so|thus|hence|therefore|then|and|or|but|however"
    rf"|except|only|while|whereas|though|although)\b)[\w'-]+){{0,4}}?"
    rf"\s+(?:{_DENIED})\b"
    rf"|\b(?:{_PROBLEM}|error|mistake|hallucination)-free\b",
    re.IGNORECASE,
)
_ANSWER_WORD = re.compile(r"^\W*(?:no|yes)\b[,.!:;]+", re.IGNORECASE)  # "No, the summary ..."


def _may_only_deny_an_error(item: str) -> bool:
    """An item whose only words naming an error, or a negation or a contrast, stand in a
    negation that may deny it ("The date isn't wrong", "The summary does not contradict the
    text"); not "Nothing wrong with the date; the name is invented", nor "Nothing inaccurate
    here, but his first name wasn't mentioned"."""
    item = _ANSWER_WORD.sub("", item)
    denied = _DENIAL.sub("", _DOUBLE_NEGATIVE.sub("", item))
    return denied != item and not (_NAMES_AN_ERROR.search(denied) or _REPORTS.search(denied))


def _ends_affirmed(item: str) -> bool:
    """An item whose last sentence affirms what it said ("The summary says Monday; the text says
    Monday. This is consistent."), with no error named or contrast drawn before it: a check
    written out, or a report withdrawn; not "... the text says 5. Overall it is accurate."."""
    sentences = split_sentences(" ".join(item.split()))
    before = " ".join(sentences[:-1])
    return bool(
        before
        and _REFERS_BACK.match(_plain(sentences[-1]))
        and _sentence_says_nothing(sentences[-1])
        and not (_REPORTS.search(before) or _CONTRAST.search(before))
    )


def _names_a_problem(item: str) -> bool:
    """Whether a description names a problem (a negation, a contrast, "wrong", "invented") or
    the texts it compares ("the summary says ..."): what a description of an inconsistency
    does and a restated fact does not."""
    return bool(_REPORTS.search(item) or _CONTRAST.search(item) or _COMPARED.search(item))


def _leads_with_none(text: str) -> bool:
    """ "None" first, on its own line or before punctuation, then an explanation ("None - the
    figures match", "None (all supported)"); "None of the figures match" is no such answer."""
    return bool(re.match(r"[\W_]*none[ \t*]*(?:\n|[.,;:!(\u2013\u2014-])", text, re.IGNORECASE))


def has_final_output(text: str) -> bool:
    """Whether a reasoning answer reached its "Final Output:" label (what the CoT prompts ask
    for), as a label at the start of a line."""
    return bool(_FINAL_LABEL.search(text or ""))


@dataclass(frozen=True)
class ParsedDescriptions:
    items: list[str]
    # False: not read with confidence (free prose, an empty or content-free answer, another
    # language, a reasoning answer without its final answer): no description, counted apart
    # and listed in the report.
    structured: bool


NOTHING = ParsedDescriptions([], True)  # read with confidence: nothing to report
APART = ParsedDescriptions([], False)  # no description read; counted apart

_BOXED = re.compile(r"\${0,2}\\boxed\{([^{}]*)\}\${0,2}")  # bounded: "$$$..." stays linear


def _english(text: str) -> bool:
    """Written in a Latin script: an answer in another script (Chinese, Cyrillic) cannot be
    read by these rules with confidence. One in another Latin language matches none of the
    rules' English patterns and is counted apart by them."""
    words = re.findall(r"[^\W\d_]+", text)
    return not words or sum(w.isascii() for w in words) / len(words) >= 0.8


def _table_rows(text: str) -> tuple[str, list[str]] | None:
    """The header and the data rows of a markdown table in the answer (its separator left
    out), None when it has no table."""
    rows = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    if len(rows) < 3 or not re.fullmatch(r"\|?[\s:|-]+\|?", rows[1]):
        return None
    return rows[0], rows[2:]


def _verdict(row: str) -> str:
    return row.strip("|").split("|")[-1].strip(" *").lower()


# What a table's verdict column asks, by its heading: a question whose "yes" affirms the
# claim, one whose "yes" flags it, or a label for verdicts that say what they mean. Any
# other heading ("Issue?", "Not in the text?") leaves a bare yes or no unread.
_AFFIRMING_HEADING = re.compile(
    r"(?:is\s+it\s+)?(?:supported|correct|consistent|accurate|true|faithful|verified|grounded"
    r"|error[- ]free|free\s+of\s+errors?|hallucination[- ]free)\??|verdict|status|label|result"
    r"|judge?ment|assessment|support(?:ed\s+by\s+the\s+text)?\??",
    re.IGNORECASE,
)
_FLAGGING_HEADING = re.compile(
    r"(?:is\s+it\s+)?(?:hallucinat(?:ed|ion)|unsupported|inconsistent|incorrect|wrong|an?\s+error"
    r"|error|contradicted|fabricated|invented)\??",
    re.IGNORECASE,
)
_SAYS_WHAT_IT_MEANS = r"supported|consistent|correct|accurate|✓|✅|✔"


def _row_affirms(row: str, heading: str) -> bool:
    """A table row whose verdict cell (the last) affirms its claim: under a heading that asks
    whether it is supported, "yes", "true" or a word that affirms; under one that asks whether
    it is hallucinated, a plain "no"; under any other, only a word that affirms by itself."""
    verdict = _verdict(row)
    if _FLAGGING_HEADING.fullmatch(heading):
        return bool(re.fullmatch(r"(?:no|false|none)\.?", verdict))
    if _AFFIRMING_HEADING.fullmatch(heading):
        return bool(re.fullmatch(rf"(?:yes|true|ok|{_SAYS_WHAT_IT_MEANS})\.?", verdict))
    return bool(re.fullmatch(rf"(?:{_SAYS_WHAT_IT_MEANS})\.?", verdict))


def _json_items(text: str) -> list[str] | bool | None:
    """The descriptions of a JSON answer, in a ```json fence or not: a list of strings, or of
    objects each with one "description" string, or an object holding one such list (or the
    string "None"); None when it is no JSON answer. An object that gives its verdict as true or
    false under a key that names it ({"consistent": true, "reason": "..."}) gives no item when
    the verdict is no problem, its one explanation when it is one, and False (not read with
    confidence) for any other shape."""
    text = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    if not text.startswith(("[", "{")):
        return None
    try:
        value = jsonl.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict) and any(isinstance(v, bool) for v in value.values()):
        return _json_verdict(value)
    if isinstance(value, dict):
        # the list under a key that names it ({"inconsistencies": [], "explanation": "..."}),
        # else the one list or string the object holds
        named = [v for k, v in value.items() if _LIST_KEY.fullmatch(str(k)) and isinstance(v, list)]
        inner = named or [v for v in value.values() if isinstance(v, (list, str))]
        if inner == [[]] and _json_reports_a_problem(value, inner[0]):
            return False  # {"has_errors": "yes", "errors": []}: the object disagrees with itself
        value = inner[0] if len(inner) == 1 else None
        if isinstance(value, str):  # {"inconsistencies": "None"}, {"inconsistencies_found": "no"}
            value = [] if value.strip().lower() in ("no", "none", "false", "0") else [value]
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        value = [v.get("description") for v in value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return [" ".join(v.split()) for v in value]


def _json_verdict(value: dict) -> list[str] | bool:
    """{"is_consistent": false, "explanation": "..."} -> ["..."]; {"hallucination": false} -> [];
    False when the verdict is not one boolean under a key that says what true means, or a
    problem comes with other than one explanation."""
    verdicts = [(k, v) for k, v in value.items() if isinstance(v, bool)]
    if len(verdicts) != 1:
        return False
    key, verdict = verdicts[0]
    if _FINE_KEY.fullmatch(str(key)):
        problem = not verdict
    elif _PROBLEM_KEY.fullmatch(str(key)):
        problem = verdict
    else:
        return False
    texts = [v for v in value.values() if isinstance(v, str)]
    if not problem:  # and no list in it holds one ({"consistent": true, "issues": ["..."]})
        nothing = all(says_nothing(t) for t in texts) and not _json_reports_a_problem(value)
        return [] if nothing else False
    return [" ".join(texts[0].split())] if len(texts) == 1 and len(value) == 2 else False


def _json_reports_a_problem(value: dict, read: object = None) -> bool:
    """Whether a JSON answer holds, besides the value `read`, a list that is not empty or a
    verdict in words under a key that names it ("has_errors": "yes", "consistent": "no")."""
    for key, other in value.items():
        if other is read:
            continue
        verdict = str(other).strip().lower() if isinstance(other, str) else None
        if isinstance(other, list) and other:
            return True
        if _PROBLEM_KEY.fullmatch(str(key)) and verdict in ("yes", "true"):
            return True
        if _FINE_KEY.fullmatch(str(key)) and verdict in ("no", "false"):
            return True
    return False


# Keys whose true says the summary is fine, and keys whose true says it is not
_FINE_KEY = re.compile(
    r"(?:is_?)?(?:consistent|faithful|supported|correct|accurate|grounded|factual)", re.I
)
_PROBLEM_KEY = re.compile(
    r"(?:is_?|has_?)?(?:hallucinat\w*|inconsisten\w*|unsupported|errors?|contains_errors?)", re.I
)
_LIST_KEY = re.compile(
    r"(?:inconsistenc\w*|issues?|errors?|problems?|descriptions?|hallucinations?|findings?)",
    re.IGNORECASE,
)


def _clean(item: str) -> str:
    item = _DESCRIPTION_LABEL.sub("", item.strip())
    return " ".join(item.replace("**", "").split())


def _marked_items(
    lines: list[str], first_indent_unknown: bool = False, trusted: bool = False
) -> list[str] | None:
    """The items of a lettered, numbered or bulleted answer (None when no line is marked): a line
    without a marker continues the item before it until a blank line; after a blank line it is
    a closing remark; before the first marker, a preamble. A sub-item continues its item: a
    marker deeper than the list's own, unless it is the list's next marker ("B." after "A.",
    "2." after "1.", the same bullet where the first item's indentation is unknown) and no
    sub-list of its depth is open; and, in a lettered or numbered list, a marker of another
    kind ("- Summary: 43" or "a)" under "1.") when the list's next marker comes after it, its
    item ends with a colon, or the list's items took such sub-items before. `trusted`: a gold
    list, whose "A. ... B. ..." on one line is always two items (else `_Ambiguous` may say that
    it holds a name's initial)."""
    items: list[str] = []
    open_item = False
    top = None  # the indentation of the list's own markers; deeper ones are sub-items
    last = None  # the marker of the list's last own item
    sub_list: tuple[int, tuple] | None = None  # (indentation, marker) of the open sub-list's last
    lines = _split_inline_items(lines, trusted)
    folded = False  # the list's items have taken sub-items of another kind
    last_seen = {_marker(line): k for k, line in enumerate(lines) if _ITEM.match(line)}
    for k, line in enumerate(lines):
        if not line.strip():
            open_item = False
            continue
        indent = len(line) - len(line.lstrip())
        match = _ITEM.match(line)
        marker = _marker(line) if match else None
        kind = last[0] if last else None  # a lettered or numbered list's sub-items: other kinds
        if match and items and open_item and kind in ("letter", "number") and marker[0] != kind:
            own_next = last_seen.get((kind, last[1] + 1), -1) > k
            if own_next or folded or items[-1].rstrip(" *").endswith(":"):
                items[-1] = f"{items[-1]} {_item_text(match)}"  # "1. Age\n- Summary: 43\n2. ..."
                folded = True
                continue
        if match and items and top is not None and indent > top:
            in_sub_list = sub_list is not None and sub_list[0] == indent
            if not in_sub_list and _follows(last, marker, first_indent_unknown):
                top, last = indent, marker  # the list's next item, indented
                first_indent_unknown = False  # once: the first item's indentation is now known
                items.append(_item_text(match))
                open_item = True
                continue
            if open_item:
                items[-1] = f"{items[-1]} {_item_text(match)}"  # a sub-item continues its item
                sub_list = (indent, marker)
                continue
        if match:
            top = indent if top is None else top
            last = marker
            sub_list = None
            items.append(_item_text(match))
            open_item = True
        elif items and (open_item or not items[-1].strip()):
            items[-1] = f"{items[-1]} {line.strip()}"
            open_item = True
    return [_clean(item) for item in items] if items else None


_MARKER = re.compile(
    r"\s*(?:#{1,6}\s*)?(?:(?P<bullet>[-*•])\s*)?(?:\*\*)?\(?(?P<mark>[A-Z]{1,2}|\d{1,3})?"
)


def _marker(line: str) -> tuple[str, int | str]:
    """A marked line's marker as (kind, value): ("letter", 1) for "A." (or "- A."), ("number", 2)
    for "2)", ("bullet", "-") for "- text", ("other", 0) for "Issue 3:" and check marks."""
    found = _MARKER.match(line)
    mark = found.group("mark") if found else None
    rest = line[found.end() :] if found else ""
    if mark and rest[:1] in ".):":
        if mark.isdigit():
            return ("number", int(mark))
        if len(mark) == 1:
            return ("letter", ord(mark.upper()) - ord("A") + 1)
    if found and found.group("bullet"):
        return ("bullet", found.group("bullet"))
    return ("other", 0)


def _follows(last: tuple | None, marker: tuple | None, same_bullet: bool) -> bool:
    """Whether `marker` is the list's next one after `last`: the next letter or number, or the
    same bullet when `same_bullet` (the first item's own indentation was lost on a label's line)."""
    if last is None or marker is None or last[0] != marker[0]:
        return False
    if marker[0] in ("letter", "number"):
        return marker[1] == last[1] + 1
    return marker[0] == "bullet" and same_bullet and marker[1] == last[1]


def _item_text(match: re.Match) -> str:
    text = match.group("lettered") or match.group("bullet") or match.group("named") or ""
    marker = match.group(0).lstrip()[:1]
    if marker in _CHECKED:  # "✅ The date is correct.": affirmed, whatever its words
        return "None"
    marked = any(c in text for c in _CHECKED) and not any(c in text for c in _CROSSED)
    if marked and not _CONTRAST.search(text):
        return "None"  # "The fire started at 3am. ✅", "Date: ✔ matches"; not "✅, but ..."
    return text


# A count, not a description: "Total inconsistencies: 2", "Number of errors = 0"
_TALLY = re.compile(
    rf"(?:total\s+)?(?:(?:number|count)\s+of\s+)?{_PROBLEM}(?:\s+found)?\s*[:=]\s*(?:\d+|zero|none)\.?",
    re.IGNORECASE,
)
_TALLY_OF_NONE = re.compile(r".*[:=]\s*(?:0|zero|none)\.?", re.IGNORECASE)
_CHECKED = "✅✔✓☑"
_CROSSED = "❌✗✘❎⚠"
# "A. text B. text" or "1) text 2) text" on one line: the next marker after a sentence's end
_INLINE_NEXT = "(?<=[.!?\"')])\\s+(?=\\(?{marker}[.)]\\s)"
_INLINE_FIRST = re.compile(r"\s*\(?([A-Ya-y]|\d{1,2})[.)]\s")


class _Ambiguous(Exception):
    """A line that reads as two items or as one with a name's initial in it: counted apart."""


def _split_inline_items(lines: list[str], trusted: bool = False) -> list[str]:
    """A line that opens with "A." (or "1.") and holds "B.", "C." ... ("2.", "3." ...) after
    sentence ends, as lines."""
    out = []
    for line in lines:
        first = _INLINE_FIRST.match(line)
        while first:
            mark = first.group(1)
            after = str(int(mark) + 1) if mark.isdigit() else chr(ord(mark) + 1)
            cut = re.search(_INLINE_NEXT.format(marker=after), line)
            if cut is None:
                break
            if not trusted and ends_in_abbreviation(line[: cut.start()]):
                raise _Ambiguous(line)  # "Sen. B. Harris": "B." may be a name's initial
            out.append(line[: cut.start()])
            line = line[cut.end() :]
            first = _INLINE_FIRST.match(line)
        out.append(line)
    return out


def _dedented(text: str) -> str:
    """The answer without the blank lines around it and without its lines' common indentation,
    each line's indentation relative to the others kept: stripping the text would take the
    first item's indentation alone, and make the next item its sub-item."""
    lines = text.splitlines()
    kept = [k for k, line in enumerate(lines) if line.strip()]
    if not kept:
        return ""
    return textwrap.dedent("\n".join(lines[kept[0] : kept[-1] + 1])).rstrip()


def read_descriptions(text: str, reasoning: bool = False) -> ParsedDescriptions:
    """A model's answer -> its descriptions ([] when it reports nothing), and whether it was in
    a format the prompts ask for (the rules are listed above `_ITEM`). `reasoning`: the answer
    is a chain of thought whose prompt asked for a "Final Output:"; without that label there
    is no final answer to read (no description, counted apart)."""
    text = _dedented(text or "")
    labels = list(_FINAL_LABEL.finditer(text))
    if labels:
        text = _dedented(text[labels[-1].end() :])
    elif reasoning:
        return APART
    text = _BOXED.sub(r"\1", text)
    text = _until_a_new_example(text)
    later = [m for m in _LATER_LABEL.finditer(text) if m.start() > 0]
    if later:
        text = text[later[-1].start() :]
    label = _ANSWER_LABEL.match(text)
    # "Answer: - x\n - y": the first item shares the label's line, its own indentation unknown
    inline_first = bool(label and text[label.end() :].split("\n", 1)[0].strip())
    text = _dedented(text[label.end() :] if label else text)
    if not text.strip(_DECORATION) or not _english(text):
        return APART  # empty: says nothing; another script: not read with confidence
    table = _table_rows(text)
    if table is not None:  # nothing to report only when every row affirms its claim
        header, rows = table
        heading = _verdict(header).strip(" *")
        return NOTHING if rows and all(_row_affirms(row, heading) for row in rows) else APART
    listed = _json_items(text)
    if listed is False:
        return APART  # a verdict as true or false: not read by these rules with confidence
    if listed is None:
        try:
            listed = _marked_items(text.splitlines(), inline_first)
        except _Ambiguous:
            return APART
    if listed is not None:
        if listed and not any(item.strip(_DECORATION + ".") for item in listed):
            return APART  # markers with no text ("A.\nB.\nC."): content-free, not "none"
        tallies = [item for item in listed if _TALLY.fullmatch(item)]
        items = [item for item in listed if not says_nothing(item) and item not in tallies]
        if items and (_closing_says_none(text) or _opening_says_none(text)):
            return APART  # items, then "No inconsistencies found." (or after "None")
        if any(map(_HEDGE.fullmatch, items)):
            return APART  # "- Not sure"
        if not items and any(not _TALLY_OF_NONE.fullmatch(item) for item in tallies):
            return APART  # "- Total inconsistencies: 2" and no description
        if any(map(_may_only_deny_an_error, items)):
            return APART  # an item that may deny an error ("The date isn't wrong"): not guessed
        if any(map(_ends_affirmed, items)):
            return APART  # "... the text says Monday. This is consistent.": a check, not a report
        # items none of which names a problem or the texts compared ("The co-pilot was Andreas
        # Lubitz."): a list of facts, not of inconsistencies; no description, counted apart
        return (
            ParsedDescriptions(items, True)
            if not items or any(map(_names_a_problem, items))
            else APART
        )
    prose = " ".join(text.split())
    if says_nothing(prose):  # "The rest is correct." alone implies what it leaves out
        return APART if _THE_REST.search(prose) else NOTHING
    sentences = [s for s in split_sentences(prose) if not says_nothing(s)]
    if (
        _leads_with_none(text)
        and not _EXCEPT.search(prose)  # "None, only the year: ..."
        and not _NAMES_AN_ERROR.search(prose)
        and len(_CLAIM.findall(prose)) < 2  # "None. Wait, the summary says 2pm, the text 3pm"
    ):
        return NOTHING  # "None - the summary restates the text."
    last_line = text.rsplit("\n", 1)[-1]  # one line: a search over all would be quadratic
    if re.fullmatch(r"[\W_]*none[\W_]*", last_line, re.IGNORECASE) and not any(
        _REPORTS.search(s) for s in sentences
    ):
        return NOTHING  # an explanation, then "None" on its own line
    return APART  # prose that reports something: not a list of descriptions (E.4: none read)


def parse_descriptions(text: str) -> list[str]:
    """The descriptions of an answer (see `read_descriptions`)."""
    return read_descriptions(text).items


def listed_descriptions(text: str) -> list[str]:
    """A gold list written in the target's own layout ("A. ..." lines, or "None"): its items as
    written. Gold is trusted, so nothing is judged for what it says (a model's answer is read
    by `read_descriptions`)."""
    text = (text or "").strip()
    if not text or _NONE.fullmatch(text.strip(_DECORATION + ".")):
        return []
    return _marked_items(text.splitlines(), trusted=True) or [" ".join(text.split())]
