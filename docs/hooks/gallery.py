"""The findings gallery, made at build time by this MkDocs hook (mkdocs.yml names it under `hooks`).

A finding is a spec in experiments/ whose analysis notebook is a finding's (notebooks/NN_<module>.py beside
bsresearch/findings/<module>.py), or a finding module whose spec is not written yet. Each gets a page,
findings/<report>.md, made from what is on disk when the site is built:
- its figures with their captions (sweeps, seeds, commits), served from its report folder as they are
  (reports/<name>/, or reports/<gpu model>/<name>/), never copied into docs/;
- the result of its pre-registered test as the report wrote it (test.md, *test.csv, or the tests in summary.md);
- its row of reports/README.md's table (the verdict with its interval) and its test in docs/protocols.md;
- the commands that reproduce it: those in its spec's header comments, then any other sweep its captions name.
findings/index.md puts every finding's verdict in one table per paper (PAPERS' order; in each, the exploratory
report, its larger-data versions, the confirmatory and the mechanism reports), each verdict as the report's
test wrote it and as reports/README.md's tables state it (the findings table, or the confirmatory and mechanism
tables for those reports), and findings/reproductions.md is reports/README.md.
A finding without a report folder is listed as not yet reported. Rebuild (or leave `make docs-serve` running:
it watches reports/) and a regenerated report is on its page.
"""
from __future__ import annotations

import csv
import html
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from mkdocs.structure.files import File
from pymdownx.slugs import slugify

ROOT = Path(__file__).resolve().parents[2]
REPORTS, EXPERIMENTS = ROOT / "reports", ROOT / "experiments"
LINKED = (".pdf", ".csv")              # a report's files the page links to, besides its figures (.png)
NOT_YET = "not yet reported"
PAPERS = {   # a finding module -> the paper(s) it reproduces, in the order the index lists them
    "keskar": "Keskar et al. 2017: large batches find sharp minima",
    "dinh": "Dinh et al. 2017: sharpness is not invariant",
    "sharpness_generalization": "Sharpness against generalization (Jiang et al. 2020, Andriushchenko et al. 2023)",
    "hoffer": "Hoffer et al. 2017: train longer, generalize better",
    "ghost_batch": "Hoffer et al. 2017: the ghost batch size",
    "goyal": "Goyal et al. 2017: linear scaling and warmup",
    "smith_kindermans": "Smith, Kindermans, Ying & Le 2018: grow the batch instead of decaying the lr",
    "steps_to_target": "Shallue et al. 2019, McCandlish et al. 2018: steps to target and the noise scale",
    "smith_le": "Smith & Le 2018, Jastrzebski et al. 2017: the best batch size and the noise scale",
    "masters_luschi": "Masters & Luschi 2018: the stable lr range",
    "nqm": "Zhang et al. 2019: the noisy quadratic model",
    "adam_vs_sgd": "Zhang et al. 2019, Nado et al. 2021: Adam against momentum SGD",
    "lm_cbs": "Merrill et al. 2025: the critical batch size by branching",
    "lm_batch_warmup": "Merrill et al. 2025: batch-size warmup",
    "lm_small_batch": "Marek et al. 2025: small batches and Adam's beta2",
    "eoss": "Andreyev & Beneventano 2024, Cohen et al. 2021, 2022: the edge of (stochastic) stability",
}
github_slug = slugify(case="lower")    # reports/README.md's links are GitHub's heading anchors


@dataclass
class Finding:
    name: str                          # the spec's name (its report folder's) or, with no spec yet, the module's
    module: str                        # bsresearch/findings/<module>.py
    spec_path: Path | None             # experiments/<name>.yaml; None: not written yet
    spec: dict                         # its contents
    report: Path | None                # its report folder; None: not yet reported

    @property
    def key(self) -> str:              # the page: findings/<key>.md
        return self.report.relative_to(REPORTS).as_posix() if self.report else self.name


def spec_file(path: Path) -> str:
    """A spec's path as the commands name it: experiments/x.yaml, experiments/confirm/x_confirm.yaml."""
    return path.relative_to(ROOT).as_posix()


def discover() -> list[Finding]:
    notebooks = {re.sub(r"^\d+_", "", p.stem) for p in (ROOT / "notebooks").glob("[0-9]*_*.py")}
    findings = {p.stem for p in (ROOT / "bsresearch" / "findings").glob("*.py")}
    # a finding with a notebook of its name, or only versioned ones (44_eoss_v6 for eoss)
    modules = {m for m in findings if any(n == m or n.startswith(f"{m}_") for n in notebooks)}
    # a notebook of its own for a finding's further test (35_hoffer_mechanism) reads that finding's module
    module_of = {n: n if n in findings else max((m for m in findings if n.startswith(f"{m}_")), key=len, default="")
                 for n in notebooks}
    found = []
    for path in sorted(EXPERIMENTS.rglob("*.yaml")):   # experiments/confirm/ too
        spec = yaml.safe_load(path.read_text()) or {}
        if "extends" in spec:          # a child spec: as merged over its parents (what a sweep of it runs)
            from bsresearch.sweep.spec import load_spec
            spec = load_spec(path).raw
        module = module_of.get(re.sub(r"^\d+_", "", Path(spec.get("analysis") or "").stem), "")   # analysis: null
        if module in modules:                                                                   # stops inheriting
            name = spec.get("name", path.stem)
            folders = [p for p in [REPORTS / name, *sorted(REPORTS.glob(f"*/{name}"))] if p.is_dir()]
            found += [Finding(name, module, path, spec, folder) for folder in folders or [None]]
    specced = {f.module for f in found}
    found += [Finding(m, m, None, {}, REPORTS / m if (REPORTS / m).is_dir() else None)
              for m in sorted(modules - specced)]
    return sorted(found, key=lambda f: (f.report is None, f.key))


# --- what the Markdown sources say ------------------------------------------------------------------------

def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def linked_rows(text: str) -> dict[str, list[str]]:
    """Table rows whose first cell is a link to an anchor of the same file: anchor -> the row's cells."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        if m := re.match(r"\|\s*\[[^\]]+\]\(#([^)]+)\)\s*\|", line):
            rows.setdefault(m[1], cells(line))
    return rows


def protocol_headings(text: str) -> dict[str, str]:
    """docs/protocols.md's anchors (<a id="..."></a> lines) -> the heading that follows them."""
    headings, pending = {}, []
    for line in text.splitlines():
        if m := re.fullmatch(r'<a id="([^"]+)"></a>', line.strip()):
            pending.append(m[1])
        elif line.startswith("#"):
            headings.update((a, line.lstrip("#").strip()) for a in pending)
            pending = []
    return headings


def readme_anchor(text: str, name: str) -> str | None:
    """The anchor of the first section of reports/README.md that names the spec or the report folder."""
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        if re.search(rf"\b{re.escape(name)}(\.yaml\b|/)", section):
            return github_slug(section.splitlines()[0], "-")
    return None


def machine(text: str) -> str:
    m = re.search(r"Machine and provenance: (.+?\.)\s", text, re.S)
    return " ".join(m[1].split()) if m else ""


# --- a report folder --------------------------------------------------------------------------------------

def escape(text: str) -> str:
    """Plain text (a caption) as Markdown: no HTML, no emphasis."""
    return html.escape(text, quote=False).replace("*", r"\*").replace("_", r"\_")


def number(value: str) -> str:
    try:
        return f"{float(value):.4g}" if "." in value else value
    except ValueError:
        return value


def csv_table(path: Path) -> str:
    with path.open(newline="") as f:
        rows = [[escape(number(c)).replace("|", r"\|") for c in row] for row in csv.reader(f) if row]
    lines = [rows[0], ["---"] * len(rows[0]), *rows[1:]]
    return "\n".join("| " + " | ".join(r) + " |" for r in lines)


def test_result(folder: Path) -> str:
    """The report's own account of its pre-registered test, as Markdown: test.md, else the first *test.csv,
    else the "Pre-registered tests" section of summary.md."""
    tests = sorted(folder.glob("*test.csv"))
    summary = folder / "summary.md"
    section = re.search(r"^## Pre-registered tests?.*?\n(.*?)(?=^## |\Z)", summary.read_text(), re.S | re.M) \
        if summary.exists() else None
    if (folder / "test.md").exists():
        text, source = (folder / "test.md").read_text(), "test.md"
    elif tests:
        text, source = csv_table(tests[0]), tests[0].name
    elif section:
        text, source = section[1], "summary.md"
    else:
        return ""
    return f"As the report wrote it, in `{folder.relative_to(REPORTS.parent).as_posix()}/{source}`:\n\n{text.strip()}\n"


def verdicts(folder: Path) -> list[str]:
    """The verdicts the report's test names: the `verdict` column of its *test.csv, else VERDICT: lines."""
    found = []
    for path in sorted(folder.glob("*test.csv")):
        with path.open(newline="") as f:
            found += [row["verdict"] for row in csv.DictReader(f) if row.get("verdict")]
    for path in [] if found else [folder / "test.md", folder / "summary.md"]:
        if path.exists():
            found += re.findall(r"VERDICT: ([a-z ]+?)(?= \(|\.|$)", path.read_text(), re.I | re.M)
    return list(dict.fromkeys(v.strip().lower() for v in found))


def captions(folder: Path) -> dict[str, str]:
    """Each figure (PNG) of the folder -> its caption, the .txt beside it (empty where there is none)."""
    return {p.stem: p.with_suffix(".txt").read_text().strip() if p.with_suffix(".txt").exists() else ""
            for p in sorted(folder.glob("*.png"))}


def caption_lines(texts: list[str], prefix: str) -> list[str]:
    return list(dict.fromkeys(line for t in texts for line in t.splitlines() if line.startswith(prefix)))


def commands(f: Finding, named_sweeps: list[str]) -> list[str]:
    """The spec's own commands (its comments' `bsresearch sweep|report` lines), with any sweep the captions
    name and those lines do not inserted before the report, and the report last if they have none."""
    text = f.spec_path.read_text()
    lines = [command.strip() for m in re.finditer(r"^#\s+(bsresearch (?:sweep|report) .+)$", text, re.M)
             for command in re.split(r"\s{2,}\(", m[1])[0].split(" && ")]
    have = {s for line in lines for s in re.findall(r"sweep experiments/(?:\w+/)?(\w+)\.yaml", line)}
    own = [f.name] if any(k in f.spec for k in ("base", "grid", "variants")) else []
    specs = {p.stem: spec_file(p) for p in sorted(EXPERIMENTS.rglob("*.yaml"))}
    missing = [s for s in dict.fromkeys(own + named_sweeps) if s not in have and s in specs]
    at = next((i for i, line in enumerate(lines) if line.startswith("bsresearch report")), len(lines))
    lines[at:at] = [f"bsresearch sweep {specs[s]}" for s in missing]
    if not any(f"report {spec_file(f.spec_path)}" in line for line in lines):
        lines.append(f"bsresearch report {spec_file(f.spec_path)}")
    return lines


# --- the pages ---------------------------------------------------------------------------------------------

@dataclass
class Sources:
    protocols: str                     # docs/protocols.md
    readme: str                        # reports/README.md

    def __post_init__(self) -> None:
        self.headings = protocol_headings(self.protocols)
        self.tests = linked_rows(self.protocols)       # anchor -> finding, primary statistic, reproduced if
        self.rows = linked_rows(self.readme)           # anchor -> finding, paper's claim, here, reproduced

    def anchor(self, f: Finding) -> str | None:
        """The finding's section of docs/protocols.md: its own, else its module's."""
        return next((a for a in (f.name.replace("_", "-"), f.module.replace("_", "-")) if a in self.headings), None)

    def test_rows(self, f: Finding, own_anchors: set[str]) -> list[list[str]]:
        """The rows of the protocols' summary table that define the finding's test: its module's row and the
        rows below it that are the finding's own (e.g. keskar-fashion says "the same" as keskar) or belong to
        no other finding (steps-to-target-noise, the second test of every steps-to-target report)."""
        module, own = f.module.replace("_", "-"), self.anchor(f)
        return [row for a, row in self.tests.items()
                if a == module or (a.startswith(f"{module}-") and (a == own or a not in own_anchors))]

    def row(self, f: Finding) -> tuple[str | None, list[str] | None]:
        anchor = readme_anchor(self.readme, f.name)
        return anchor, self.rows.get(anchor or "")

    def summary_verdict(self, f: Finding) -> str | None:
        """The verdict reports/README.md states for this report: a confirmatory or mechanism report's from the
        table that lists it (its first cell the report's name, or a cell naming `reports/<name>/`), any
        other's from the findings table's last column; None when no table lists it."""
        for line in self.readme.splitlines():
            if not line.startswith("| "):
                continue
            row = cells(line)
            if re.fullmatch(r"\d+(\.\d+)?", row[1] if len(row) > 1 else ""):
                continue                       # the "judged by" table: a version, not a verdict
            if len(row) >= 3 and (row[0] == f.name or f"reports/{f.name}/" in line) \
                    and (f.name.endswith("_confirm") or "mechanism" in f.name):
                return row[2]
        _, row = self.row(f)
        return row[-1] if row else None


def finding_page(f: Finding, src: Sources, own_anchors: set[str]) -> str:
    root = "../" * (f.key.count("/") + 1)                 # the page is findings/<key>.md
    own = f.key.rsplit("/", 1)[-1]                        # its report's files: findings/<key>/
    anchor = src.anchor(f)
    readme_anchor_, row = src.row(f)
    out = [f"# {f.key} — {src.headings.get(anchor or '', f.name)}", ""]
    if f.spec.get("description"):
        out += [escape(f.spec["description"]), ""]
    api = f"{root}api/findings.md#bsresearch.findings.{f.module}"
    facts = [("report", f"`reports/{f.key}/`" if f.report else f"**{NOT_YET}**: no folder `reports/{f.name}/` yet"),
             ("spec", f"`{spec_file(f.spec_path)}`" if f.spec_path else "not written yet"),
             ("analysis", f"`bsresearch/findings/{f.module}.py` ([API]({api}))")]
    base = f.spec.get("base") or {}
    if base.get("dataset"):
        size = f" (train_size {base['train_size']})" if base.get("train_size") else ""
        facts.append(("data, model", f"`{base['dataset']}`{size}, `{base.get('model', 'cnn1d')}` (the spec's base)"))
    figures = captions(f.report) if f.report else {}
    texts = list(figures.values())
    for label, prefix in (("runs, from the captions", "Sweep "), ("drawn at", "Drawn at commit ")):
        if found := caption_lines(texts, prefix):
            facts.append((label, "".join(f"\n    - {escape(line.removeprefix('Drawn at '))}" for line in found)))
    if f.report and (line := machine(src.readme)):
        facts.append(("machine", f"reports/README.md: “{escape(line)}”"))
    out += [*(f"- **{k}**: {v}" for k, v in facts), ""]

    out += ["## Verdict", ""]
    if (f.name.endswith("_confirm") or "mechanism" in f.name) and (stated := src.summary_verdict(f)):
        out += [f"**{stated}** ([reports/README.md]({root}findings/reproductions.md#confirmatory-and-mechanism-tests); "
                "its confirmatory and mechanism tables)", ""]
    elif row:
        out += [f"**{row[-1]}** ([reports/README.md]({root}findings/reproductions.md#{readme_anchor_})): {row[2]}", ""]
    else:
        out += [f"Not in reports/README.md's table yet ({NOT_YET})." if not f.report
                else "reports/README.md's table has no row for this report yet.", ""]
    out += ["## The pre-registered test", ""]
    if anchor:
        out += [f"Fixed before its runs: [{src.headings[anchor]}]({root}protocols.md#{anchor}).", ""]
        if rows := src.test_rows(f, own_anchors):
            out += ["| protocol | primary statistic | reproduced if |", "|---|---|---|",
                    *("| " + " | ".join([re.sub(r"\(#", f"({root}protocols.md#", row[0]), *row[1:]]) + " |"
                      for row in rows), ""]
    if f.report and (result := test_result(f.report)):
        out += [result, ""]

    if figures:
        out += ["## Figures", ""]
        for stem, text in figures.items():
            pdf = f"[PDF]({own}/{stem}.pdf)" if (f.report / f"{stem}.pdf").exists() else ""
            out += [f"### {stem}", "", f"![{stem}]({own}/{stem}.png)", "",
                    *(escape(line) + "\n" for line in text.splitlines()), pdf, ""]
        tables = sorted(p.name for p in f.report.glob("*.csv"))
        out += ["## Tables", "", ", ".join(f"[{t}]({own}/{t})" for t in tables), ""]

    out += ["## Reproduce", ""]
    if f.spec_path:
        named = [s for line in caption_lines(texts, "Sweep ") for s in re.match(r"Sweep (.+?) \(", line)[1].split(", ")]
        out += ["```bash", *commands(f, named), "```", "",
                "`make reproduce` runs every reproduction's sweeps and reports in order "
                f"([Reproducing them]({root}reproducing.md)).", ""]
    else:
        out += [f"No spec in `experiments/` yet: its analysis is `bsresearch/findings/{f.module}.py`.", ""]
    return "\n".join(out)


def kind_order(f: Finding) -> tuple[int, str]:
    """Within a paper: the exploratory report, its larger-data versions, confirmatory, mechanism, unreported."""
    name = f.name
    rank = 4 if f.report is None else 3 if "mechanism" in name else 2 if name.endswith("_confirm") else \
        0 if name == f.module else 1
    return rank, f.key


def by_paper(findings: list[Finding]) -> list[tuple[str, list[Finding]]]:
    """The findings grouped by their module (the paper), in PAPERS' order (others after, by name)."""
    modules = sorted({f.module for f in findings}, key=lambda m: (list(PAPERS).index(m) if m in PAPERS else
                                                                  len(PAPERS), m))
    return [(m, sorted((f for f in findings if f.module == m), key=kind_order)) for m in modules]


def index_page(findings: list[Finding], src: Sources) -> str:
    out = ["# Findings", "",
           "One page per finding, made when the site is built from its report folder in `reports/`, its row of "
           "reports/README.md and its test in the [protocols](../protocols.md#findings): the figures with their "
           "captions, the pre-registered test and its result, the data, seeds, machine and commits, and the "
           "commands that reproduce it. The full account, claim by claim, is [reports/README.md](reproductions.md); "
           "how to run them all, and what it costs, is [Reproducing them](../reproducing.md).", "",
           "Grouped by paper; in each, the exploratory (or prospective) report first, then its larger-data versions, "
           "the confirmatory report (protocol version 3, the headline where it exists) and the mechanism tests "
           "(version 4).", ""]
    for module, group in by_paper(findings):
        out += [f"## {PAPERS.get(module, module)}", "",
                "| report | pre-registered test | its verdict in the report | as reports/README.md states it |",
                "|---|---|---|---|"]
        for f in group:
            anchor = src.anchor(f)
            test = f"[{src.headings[anchor]}](../protocols.md#{anchor})" if anchor else ""
            verdict = ", ".join(verdicts(f.report)) if f.report else NOT_YET
            stated = src.summary_verdict(f) or (NOT_YET if not f.report else "—")
            out.append(f"| [{f.key}]({f.key}.md) | {test} | {verdict or '—'} | {stated} |")
        out.append("")
    out += ["## One figure of each", "", '<div class="grid cards" markdown>', ""]
    for f in findings:
        if figure := next(iter(captions(f.report)), None) if f.report else None:
            out += [f"-   [**{f.key}**]({f.key}.md): `{figure}`", "",
                    f"    [![{figure}]({f.key}/{figure}.png)]({f.key}.md)", ""]
    return "\n".join(out + ["</div>", ""])


# --- MkDocs events ---------------------------------------------------------------------------------------

_findings: list[Finding] = []


def on_config(config):
    """Discover the findings and list their pages in the nav's Findings section, after its index."""
    _findings[:] = discover()
    pages = [{f.key: f"findings/{f.key}.md"} for f in _findings if f.report]
    pending = [{f.key: f"findings/{f.key}.md"} for f in _findings if not f.report]
    for entry in config.nav:
        if isinstance(entry, dict) and "Findings" in entry:
            entry["Findings"] += pages + ([{"Not yet reported": pending}] if pending else [])
    return config


def on_files(files, config):
    src = Sources((ROOT / "docs" / "protocols.md").read_text(), (REPORTS / "README.md").read_text())
    pages = {"findings/index.md": index_page(_findings, src),
             "findings/reproductions.md": (REPORTS / "README.md").read_text()}
    own_anchors = {f.name.replace("_", "-") for f in _findings}
    for f in _findings:
        pages[f"findings/{f.key}.md"] = finding_page(f, src, own_anchors)
        for path in sorted(f.report.iterdir()) if f.report else []:
            if path.suffix in (".png", *LINKED):
                files.append(File.generated(config, f"findings/{f.key}/{path.name}", abs_src_path=str(path)))
    for uri, text in pages.items():
        files.append(File.generated(config, uri, content=text))
    return files
