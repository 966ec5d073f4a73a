"""The docs' pictures of a demo run's calibration report, made from the run, never by hand:

    docs/images/report.png              the top of report.html (its summary and first plots) at 1400 px wide,
                                        as headless Chromium shows it
    docs/images/demo_before_scatter.png the report's scatter plots of the judge before and after training
    docs/images/demo_after_scatter.png

    make demo && .venv/bin/python docs/report_images.py demo_outputs

The run's figures (Pearson, times, commit) are in demo_outputs/figures.json. Needs Debian's chromium and
chromium-driver (mmjudge/judge/testing/browser.py).
"""

import argparse
import shutil
import sys
from pathlib import Path

from mmjudge.judge.testing.browser import Browser

IMAGES = Path(__file__).parent / "images"
WIDTH, HEIGHT = 1400, 1800  # CSS pixels: the summary and the first row of plots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demo_dir", nargs="?", default="demo_outputs", help="a judge-demo --output_dir (default: demo_outputs)")
    parser.add_argument("--images", default=str(IMAGES), help=f"where the pictures go (default: {IMAGES})")
    args = parser.parse_args()
    report, images = Path(args.demo_dir) / "report", Path(args.images)
    with Browser() as chromium:
        page = chromium.open(report / "report.html", WIDTH)
        if page.errors or not all(image.loaded for image in page.images):
            sys.exit(f"{report / 'report.html'}: {page.errors or 'an image did not load'}")
        chromium.screenshot(images / "report.png", height=min(HEIGHT, page.height))
    for judge in ("before", "after"):
        shutil.copyfile(report / "plots" / f"{judge}_scatter.png", images / f"demo_{judge}_scatter.png")
    print(f"{images}: report.png (the top {min(HEIGHT, page.height)} px of {report / 'report.html'} at {WIDTH} px), "
          "demo_before_scatter.png, demo_after_scatter.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
