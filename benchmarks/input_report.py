"""The input benchmark's tables: per dataset and size the throughput rows and their ratios, then a summary;
and the shorter table of a row set against one base row (`input resize`, `input guard`).

Every figure comes from `measure.Source`s that ran in the same interleaved rounds: images/s
(wall clock, moved by other load), images per CPU-second (this process and its workers, which
other load hardly moves), and ratios as medians of per-round ratios with their min–max.
"""
import statistics

from PIL import Image

from benchmarks.measure import CORES, load_text, median, round_ratios, spread, target_line

ROWS = ("ceiling", "cores", "a", "b", "c", "d", "e", "f", "g", "h")


def cores_per_thousand(source):
    """CPU cores that keep up 1,000 images/s of this source: 1,000 ÷ its images per CPU-second."""
    return 1000 / statistics.median(source.cpu_rates)


def size_label(bench):
    """'64x64 (default)' or '224x224': the output size, and whether it is the dataset's own."""
    height, width = bench.size
    return f"{height}x{width}" + (" (default)" if bench.image_size is None else "")


def print_rows(bench, by_key, notes, repeats, load):
    """The dataset's heading and its table: one line per row measured or left out."""
    rate = {key: median(source) for key, source in by_key.items()}
    with Image.open(bench.first_image()) as image:
        example_image = f"{image.width}x{image.height} {image.format}"
    paired = bench.spec.paired
    what = "images (pairs drawn from them)" if paired else "images"
    print(f"\n### {bench.name}: {example_image} sources -> {size_label(bench)}, batch {bench.batch_size}"
          f"{' pairs' if paired else ''}, {len(bench.table)} training {what}; median of {repeats} interleaved "
          f"rounds; load average (1 min) {load[0]:.2f} before, {load[1]:.2f} after the rounds\n")
    header = ("| row | input source | images/s | min–max |" + (" pairs/s |" if paired else "") +
              " ÷ c (min–max) | images per CPU-s | ÷ c per CPU-s (min–max) | cores per 1,000 images/s |"
              " cores busy | others' cores | load before–after |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for key in ROWS:
        if key in by_key:
            source, value = by_key[key], rate[key]
            rates = f"{min(source.rates):,.0f}–{max(source.rates):,.0f}"
            pairs = f" {value / 2:,.0f} |" if paired else ""
            vs_c = spread(round_ratios(by_key, key, "c")) if "c" in by_key else "–"
            cpu_vs_c = spread(round_ratios(by_key, key, "c", "cpu_rates")) if "c" in by_key else "–"
            print(f"| {key} | {source.title} | {value:,.0f} | {rates} |{pairs} {vs_c} | "
                  f"{statistics.median(source.cpu_rates):,.0f} | {cpu_vs_c} | {cores_per_thousand(source):.2f} | "
                  f"{statistics.median(source.busy):.2f} | {statistics.median(source.others):.2f} | "
                  f"{load_text(source)} |")
        elif key in notes:
            print(f"| {key} | {notes[key]} | – | – |" + (" – |" if paired else "") + " – | – | – | – | – | – | – |")
    extra = [f"{key[0]}: {notes[key]}" for key in ("d_convert", "e_convert", "f_fill") if key in notes]
    if extra:
        print("\n(" + "; ".join(extra) + ")")
    return rate


def print_ratios(bench, by_key):
    """The ratios against their targets: medians of per-round ratios, with their min–max."""
    chest = bench.name == "chest_xray"
    print(f"\nratios ({bench.name} at {size_label(bench)}; median of per-round ratios, min–max over rounds):")
    print(target_line("c ÷ ceiling", round_ratios(by_key, "c", "ceiling"), 0.8 if bench.spec.paired else 0.85))
    if "cores" in by_key:
        print(f"  {'c ÷ cores':<26} {spread(round_ratios(by_key, 'c', 'cores'))}   (diagnostic: c against "
              f"every core decoding at once; cores ÷ ceiling {spread(round_ratios(by_key, 'cores', 'ceiling'))})")
    print(target_line("c ÷ a", round_ratios(by_key, "c", "a"), 3 if chest else 4))
    print(target_line("c ÷ b", round_ratios(by_key, "c", "b"), 1.3))
    print(target_line("e ÷ c", round_ratios(by_key, "e", "c"), 30 if chest and bench.size == (224, 224) else None))
    print(target_line("d ÷ c", round_ratios(by_key, "d", "c"), None))
    print(target_line("f ÷ c", round_ratios(by_key, "f", "c"), None))
    if bench.name in ("lfw_pairs", "imagenet_det"):
        print(target_line("c ÷ g", round_ratios(by_key, "c", "g"), 3))
    if bench.name == "imagenet_det":
        print(target_line("c ÷ h", round_ratios(by_key, "c", "h"), None))
    if bench.spec.paired and "c" in by_key:
        c = median(by_key["c"])
        print(f"  pair pipeline c: {c / 2:,.0f} pairs/s = {c:,.0f} images/s (two decodes per pair)")
    if "c" in by_key and "ceiling" in by_key:
        # CPU time is immune to other processes' load: how much work per image c adds to the bare decode.
        print(target_line("c ÷ ceiling per CPU-second", round_ratios(by_key, "c", "ceiling", "cpu_rates"),
                          0.9 if chest else None) +
              "   (per core: c's CPU cost per image vs the minimal one-core decode, hardly moved by other load)")


def report_dataset(bench, sources, notes, repeats, load):
    """Prints the dataset's table and ratios; returns its summary entry."""
    by_key = {source.key: source for source in sources}
    rate = print_rows(bench, by_key, notes, repeats, load)
    print_ratios(bench, by_key)
    return {"by_key": by_key, "rate": rate, "notes": notes, "load": load, "label": f"{bench.name} {size_label(bench)}"}


# ---------------------------------------------------------------------------------------------
# The summary over datasets and sizes

SUMMARY_TITLES = {"ceiling": "minimal TF decode (read, decode, bilinear resize), one core x cores",
                  "cores": f"minimal TF decode on all {CORES} cores at once",
                  "a": "Python loop + PIL, `tf.constant` per batch",
                  "b": f"PyTorch DataLoader, {CORES} workers + PIL",
                  "c": "`input_fn`, `pipeline.source=files`", "d": "TFRecord `encoded`", "e": "TFRecord `raw`",
                  "f": "`pipeline.cache=memory`",
                  "g": "tutorial baseline (LFW: from_generator + PIL; DET: from_generator + py_function XML)",
                  "h": "DET tutorial, decode in a 2nd map (auto-parallelised)"}


def summary_cell(entry, key):
    """'× c per CPU-s (min–max) / × c per wall-s (min–max) / cores per 1,000 images/s', or why absent."""
    by_key = entry["by_key"]
    if key not in by_key:
        return entry["notes"].get(key, "–").split(":")[0]
    if key == "c":
        return f"1 / 1 / {cores_per_thousand(by_key[key]):.2f}"
    cpu = spread(round_ratios(by_key, key, "c", "cpu_rates"))
    wall = spread(round_ratios(by_key, key, "c"))
    return f"{cpu} / {wall} / {cores_per_thousand(by_key[key]):.2f}"


def print_summary(entries, args):
    """One table over every dataset and size: the README's 'Which input source to use'."""
    if not entries:
        return
    print(f"\n## Which input source to use ({CORES} cores, batch {args.batch_size}; each cell: × c in images per "
          "CPU-second / × c in images/s, medians of per-round ratios (min–max), / cores per 1,000 images/s)\n")
    print("| input source | " + " | ".join(entry["label"] for entry in entries) + " |")
    print("|---|" + "---|" * len(entries))
    for key in ROWS:
        if not any(key in entry["by_key"] or key in entry["notes"] for entry in entries):
            continue
        print(f"| {key}: {SUMMARY_TITLES[key]} | " + " | ".join(summary_cell(entry, key) for entry in entries) + " |")
    print("| load average (1 min), before–after | " +
          " | ".join(f"{entry['load'][0]:.2f}–{entry['load'][1]:.2f}" for entry in entries) + " |")


# ---------------------------------------------------------------------------------------------
# A row set against one base row


def print_against(heading, sources, base):
    """`heading`, then one line per source: images/s and images per CPU-second (medians, min–max), each as
    the median of per-round ratios to the `base` row's, others' cores and the load around it."""
    by_key = {source.key: source for source in sources}
    print(f"\n{heading}\n")
    header = (f"| row | what | images/s (min–max) | ÷ {base} (min–max) | images per CPU-s (min–max) | "
              f"÷ {base} per CPU-s (min–max) | others' cores | load before–after |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for source in sources:
        print(f"| {source.key} | {source.title} | {spread(source.rates, 0)} | "
              f"{spread(round_ratios(by_key, source.key, base))} | {spread(source.cpu_rates, 0)} | "
              f"{spread(round_ratios(by_key, source.key, base, 'cpu_rates'))} | "
              f"{statistics.median(source.others):.2f} | {load_text(source)} |")
