"""Builds tests/assets/prepared/: a small prepared-data folder for the fast test tier, made by the
project's own code (the task converters, the contamination guard, the writer) from short
synthetic records in each benchmark's raw format, written here in the project's own words.

    python tests/assets/make_prepared.py          # rewrite tests/assets/prepared/

`tests/test_assets.py` rebuilds it into a temporary folder and checks it equals the committed
copy byte for byte, so it cannot drift from the converters.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from fincheck.data_prep.prepare import PrepareConfig, prepare_from_files
from fincheck.io.sources import sha256_file
from fincheck.tasks import get_task

HERE = Path(__file__).resolve().parent
OUT = HERE / "prepared"

ARTICLES = [
    "The town council of Eastbridge approved a budget of 4 million euros for a new library on "
    "Monday. The library will open in 2027 next to the railway station. Mayor Ana Ruiz said the "
    "building will hold 80,000 books and a room for children.",
    "A storm closed the port of Norvik for two days this week. Ferries to the islands were "
    "cancelled and about 300 travellers spent the night in a sports hall. The port reopened on "
    "Thursday morning after the wind dropped.",
    "The chemist Lena Ortiz won the national science prize for her work on cheap water filters. "
    "Her filter, made from clay and sawdust, removes most bacteria. She plans to give the design "
    "away for free to schools in rural areas.",
    "Greenfield Rovers beat City United 3-1 in the cup final on Saturday. Striker Tom Hale scored "
    "twice in the second half. It is the first cup the club has won since 1998.",
    "A bakery in Millford has baked bread with flour from its own fields for ten years. The owner, "
    "Peter Sand, grows wheat on twelve hectares and mills it in a barn behind the shop.",
    "The museum of Old Harbour reopened after a two-year renovation. Visitors can now see a "
    "restored whaling boat and a new gallery of maps. Entry is free on Sundays.",
    "Engineers finished a bridge over the river Tal that links the villages of Orn and Besk. The "
    "bridge is 240 metres long and cost 19 million euros. Cars will cross it from May.",
    "The singer Mara Voss cancelled her autumn tour because of a throat illness. Her agent said "
    "she needs three months of rest. Tickets will be refunded.",
    "A school in Westmere started teaching chess to all pupils aged eight. The head teacher says "
    "concentration in maths lessons has improved since the classes began in March.",
    "Farmers near Calder reported a record apple harvest after a warm spring. Prices at the "
    "local market fell by a third in September.",
    # 10-15: FHSumBench documents and one more DeFacto item, shared with no other set
    "The lighthouse at Cape Rell was switched off after 140 years of service. A solar beacon on "
    "a steel mast now guides ships past the reef.",
    "A volunteer group planted 5,000 trees along the motorway near Hollin in one weekend. The "
    "saplings are oak, birch and rowan.",
    "The orchestra of Saint Avel will play its first concert in the new hall on Friday. The hall "
    "has 1,200 seats and was designed by a local architect.",
    "Police in Dunmore found a lost parrot that had flown 30 kilometres from its home. The bird "
    "was returned to its owner on Tuesday.",
    "A start-up in Rivo makes bicycle frames from bamboo. It sold 900 frames last year, most of "
    "them abroad.",
    "The ferry Aurora made its last crossing between Kell and Marsa after 35 years. A larger "
    "electric ferry replaces it next month.",
]


def qasem_record(source_id: int, article: str, sentence: str, dataset: str, qas: list) -> dict:
    return {
        "source_id": source_id,
        "source": article.split(),
        "summary": [sentence.split()],
        "model": "synthetic",
        "dataset": dataset,
        "qas": [
            {
                "qa_id": k,
                "sent_id": 0,
                "predicate": predicate,
                "question": question,
                "answer": answer,
                "annotations": votes,
            }
            for k, (predicate, question, answer, votes) in enumerate(qas)
        ],
    }


def raw_records() -> dict[str, list[dict] | dict]:
    a = ARTICLES
    qasem_dev = [
        qasem_record(
            1,
            a[0],
            "The council approved 4 million euros for a library .",
            "cliff",
            [
                ("approved", "who approved something ?", "The council", [0, 0, 0]),
                ("approved", "what did someone approve ?", "4 million euros", [0, 0, 1]),
            ],
        ),
        qasem_record(
            2,
            a[1],
            "A storm closed the port for a week .",
            "cliff",
            [
                ("closed", "what closed something ?", "A storm", [0, 0, 0]),
                ("closed", "how long was something closed ?", "for a week", [1, 1, 0]),
            ],
        ),
        qasem_record(
            3,
            a[2],
            "Lena Ortiz won a prize for her filters .",
            "factscore",
            [
                ("won", "who won something ?", "Lena Ortiz", [0, 0, 0]),
                ("won", "what did someone win ?", "a prize", [0, 1, 0]),
            ],
        ),
        qasem_record(
            4,
            a[3],
            "Tom Hale scored three goals in the final .",
            "verifiability",
            [
                ("scored", "who scored ?", "Tom Hale", [0, 0, 0]),
                ("scored", "how many goals did someone score ?", "three goals", [1, 1, 1]),
            ],
        ),
    ]
    qasem_test = [
        qasem_record(
            5,
            a[4],
            "Peter Sand grows wheat on twenty hectares .",
            "cliff",
            [
                ("grows", "who grows something ?", "Peter Sand", [0, 0, 0]),
                ("grows", "where does someone grow something ?", "on twenty hectares", [1, 1, 0]),
            ],
        ),
        qasem_record(
            6,
            a[5],
            "The museum reopened after a renovation .",
            "factscore",
            [
                ("reopened", "what reopened ?", "The museum", [0, 0, 0]),
                ("reopened", "when did something reopen ?", "after a renovation", [0, 0, 1]),
            ],
        ),
        qasem_record(
            7,
            a[6],
            "The bridge cost 19 million euros and opens in June .",
            "verifiability",
            [
                ("cost", "what cost something ?", "The bridge", [0, 0, 0]),
                ("opens", "when does something open ?", "in June", [1, 0, 1]),
            ],
        ),
    ]
    fhsumbench = [
        {
            "id": 1,
            "source": a[10],
            "summary": "The Cape Rell lighthouse was switched off.",
            "label": "no_hallu",
            "hallu_span": "",
        },
        {
            "id": 2,
            "source": a[10],
            "summary": "Cape Rell, on the Atlantic coast, lost its lighthouse.",
            "label": "factual_hallu",
            "hallu_span": "on the Atlantic coast",
        },
        {
            "id": 3,
            "source": a[11],
            "summary": "Volunteers planted 5,000 trees near Hollin.",
            "label": "no_hallu",
            "hallu_span": "",
        },
        {
            "id": 4,
            "source": a[11],
            "summary": "Volunteers, all of them penguins, planted trees.",
            "label": "non_factual_hallu",
            "hallu_span": "all of them penguins",
        },
        {
            "id": 5,
            "source": a[12],
            "summary": "The Saint Avel orchestra plays in a new hall.",
            "label": "no_hallu",
            "hallu_span": "",
        },
        {
            "id": 6,
            "source": a[12],
            "summary": "The hall, built of ice in July, seats 1,200.",
            "label": "non_factual_hallu",
            "hallu_span": "built of ice in July",
        },
        {
            "id": 7,
            "source": a[13],
            "summary": "A parrot, a talking grey, flew 30 kilometres.",
            "label": "factual_hallu",
            "hallu_span": "a talking grey",
        },
        {
            "id": 8,
            "source": a[13],
            "summary": "Police returned a lost parrot to its owner.",
            "label": "no_hallu",
            "hallu_span": "",
        },
        {
            "id": 9,
            "source": a[14],
            "summary": "A Rivo start-up sells bamboo bicycle frames.",
            "label": "no_hallu",
            "hallu_span": "",
        },
        {
            "id": 10,
            "source": a[14],
            "summary": "The start-up, founded in 2015, sold 900 frames.",
            "label": "factual_hallu",
            "hallu_span": "founded in 2015",
        },
    ]

    def defacto(doc_id: int, article: str, candidate: str, explanation: str = "", edits: int = 0):
        return {
            "doc_id": doc_id,
            "article": article,
            "abstract": "",
            "candidate": candidate,
            "has_error": bool(explanation),
            "intrinsic_error": False,
            "extrinsic_error": bool(explanation),
            "feedback": {"explanation": explanation, "instruction_list": ["edit"] * edits},
        }

    defacto_files = {
        "train": [
            defacto(11, a[0], "Eastbridge will open a library in 2027."),
            defacto(
                12,
                a[1],
                "The port of Norvik closed for a week.",
                "The port closed for two days, not a week.",
                1,
            ),
            defacto(
                13,
                a[2],
                "Lena Ortiz, a physicist, will sell her filter design.",
                "The summary calls her a physicist; she is a chemist. Also she gives the "
                "design away for free rather than selling it.",
                2,
            ),
        ],
        "val": [
            defacto(21, a[3], "Greenfield Rovers won the cup final 3-1."),
            defacto(
                22, a[15], "The ferry Aurora sailed for 53 years.", "It sailed for 35 years.", 1
            ),
        ],
        "test": [
            defacto(31, a[6], "A new bridge links Orn and Besk."),
            defacto(
                32,
                a[7],
                "Mara Voss cancelled her tour after breaking her leg.",
                "The text says a throat illness, not a broken leg.",
                1,
            ),
            defacto(
                33,
                a[8],
                "Chess classes in Westmere began in March for pupils aged ten.",
                "The pupils are aged eight, not ten.",
                1,
            ),
            defacto(
                34,
                a[9],
                "Apple prices in Calder fell by half in September.",
                "Prices fell by a third. The summary also leaves out the warm spring.",
                2,
            ),
        ],
    }
    return {
        "qasem/dev.jsonl": qasem_dev,
        "qasem/test.jsonl": qasem_test,
        "fhsumbench/FHSumBench_data.json": fhsumbench,
        **{f"defacto/{split}.jsonl": records for split, records in defacto_files.items()},
    }


def build(out_dir: Path) -> dict:
    """Write the raw records to a scratch folder and prepare them into `out_dir`."""
    config = PrepareConfig()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp)
        for name, records in raw_records().items():
            path = raw / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if name.endswith(".json"):
                path.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
            else:
                path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        files, inputs = {}, {}
        for task in config.tasks:
            for source in get_task(task).sources(config):
                files[source.name] = raw / source.name
                inputs[source.name] = {"sha256": sha256_file(raw / source.name), "synthetic": True}
        return prepare_from_files(
            config, files, inputs, out_dir, progress=False, log=lambda _: None
        )


if __name__ == "__main__":
    manifest = build(OUT)
    print(json.dumps(manifest["counts"], indent=1))
    sys.exit(0)
