"""How fast a study page with 5,000 trials becomes interactive in headless Chromium.

    python benchmarks/dashboard_interactive.py --output benchmarks/results/dashboard_interactive.json

Seeds a fresh database (a SQLite file by default, or --storage URL of an empty database) with one study of
5,000 trials (two families, 9 hyperparameters, 50 turns each; the seeding of benchmarks/api_latency.py),
serves it with `tuner serve`, and opens /dashboard/studies/bench in Debian's Chromium (Playwright, no
downloaded browser) --loads times, each in a fresh browser context (no HTTP cache). Per load it records,
from navigation start: DOMContentLoaded (the server-rendered trial table shows), the moment the page is
interactive (a click on the table's sort header, made as soon as the table shows, has been answered with
the re-sorted table), the first plots drawn, every plot drawn, and the bytes transferred. The first load
is cold (the server computes PED-ANOVA importance for the first time); the others are warm.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_latency import FAMILIES, SPACE, STUDY, free_port, seed, wait_until_up  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
SORT_WATCH = """
document.addEventListener("click", () => { window.clickedAt ??= performance.now(); }, true);
new MutationObserver(() => {
  const header = document.querySelector("#trials-table th a[data-query*='sort=number']");
  if (window.sortedAt === undefined && header && header.textContent.includes("▲")) {
    window.sortedAt = performance.now();
  }
}).observe(document, {subtree: true, childList: true});
"""


def one_load(browser, base_url: str) -> dict:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    transferred = []
    page.on("response", lambda response: transferred.append(response))
    page.add_init_script(SORT_WATCH)
    page.goto(f"{base_url}/dashboard/studies/{STUDY}", wait_until="domcontentloaded")
    page.click("#trials-table th a:text('trial')")  # a user sorting the table as soon as it shows
    page.wait_for_function("window.sortedAt !== undefined", timeout=120_000)
    page.wait_for_selector("body[data-ready=true]", timeout=120_000)
    timing = page.evaluate("""() => ({
        dom_content_loaded_ms: performance.getEntriesByType("navigation")[0].domContentLoadedEventEnd,
        clicked_ms: window.clickedAt,
        interactive_ms: window.sortedAt,
        plots_drawn_ms: Number(document.body.dataset.interactiveMs),
        all_plots_ms: Number(document.body.dataset.readyMs),
        plots_ms: Object.fromEntries([...document.querySelectorAll("[data-src]")].map(
            e => [e.id, Number(e.dataset.readyMs)])),
        table_rows: document.querySelectorAll("#trials-table tbody tr").length,
        history_points: document.getElementById("history").data.reduce((n, t) => n + (t.x ? t.x.length : 0), 0),
        parallel_lines: new Set(document.getElementById("parallel").data.flatMap(
            t => t.customdata.filter(point => point).map(point => point[0]))).size,
    })""")
    sizes = {}
    for response in transferred:
        path = response.url.split(base_url, 1)[-1]
        sizes[path] = len(response.body())
    context.close()
    timing["bytes"] = sizes
    timing["bytes_total"] = sum(sizes.values())
    return timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", help="an empty database to seed [default: a new SQLite file]")
    parser.add_argument("--trials", type=int, default=5000)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--loads", type=int, default=6)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/dashboard_interactive.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        url = args.storage or f"sqlite:///{folder}/bench.db"
        started = time.perf_counter()
        seed(url, args.trials, args.turns)
        seeding_seconds = time.perf_counter() - started
        print(f"seeded {args.trials} trials x {args.turns} turns in {seeding_seconds:.1f} s")
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "lm_tuner.tuner", "serve", "--storage", url, "--artifacts", f"{folder}/artifacts",
             "--no-worker", "--port", str(port)],
            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_until_up(f"{base_url}/health")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                loads = [one_load(browser, base_url) for _ in range(args.loads)]
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    warm = loads[1:]
    for number, load in enumerate(loads):
        print(f"load {number} ({'cold' if number == 0 else 'warm'}): table shown {load['dom_content_loaded_ms']:.0f} "
              f"ms, sort clicked then answered {load['clicked_ms']:.0f} -> {load['interactive_ms']:.0f} ms, "
              f"plots {load['plots_drawn_ms']:.0f} ms, all {load['all_plots_ms']:.0f} ms, "
              f"{load['bytes_total'] / 1e6:.2f} MB, "
              f"plots {json.dumps({k: round(v) for k, v in load['plots_ms'].items()})}")
    result = {
        "benchmark": "dashboard_interactive",
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_average": os.getloadavg()},
        "browser": CHROMIUM,
        "database": url.split("://")[0] if args.storage else "SQLite (file)",
        "study": {"trials": args.trials, "turns_per_trial": args.turns, "families": list(FAMILIES),
                  "hyperparameters": len(SPACE), "seeding_seconds": seeding_seconds},
        "definition": ("milliseconds from navigation start in a fresh browser context. interactive: a click "
                       "on the trial table's sort header, made as soon as the (server-rendered) table shows, "
                       "has been answered with the re-sorted table from the server; plots_drawn: history, "
                       "Pareto front and learning curves drawn; all_plots: the deferred parallel-coordinate "
                       "and importance plots too"),
        "interactive_ms": {"cold": loads[0]["interactive_ms"],
                           "warm_median": statistics.median(load["interactive_ms"] for load in warm),
                           "warm_max": max(load["interactive_ms"] for load in warm)},
        "plots_drawn_ms": {"cold": loads[0]["plots_drawn_ms"],
                           "warm_median": statistics.median(load["plots_drawn_ms"] for load in warm)},
        "all_plots_ms": {"cold": loads[0]["all_plots_ms"],
                         "warm_median": statistics.median(load["all_plots_ms"] for load in warm)},
        "loads": loads,
        "target": {"interactive_ms": 2000},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
