"""A request's images (serve/images.py): what a request that names paths costs, and the root they are confined to."""

import base64
import io
import tempfile

from PIL import Image

from mmjudge.judge.data import JudgeResult
from mmjudge.judge.identity import stamp
from mmjudge.judge import identity
from mmjudge.judge.prompts import load_rubrics
from mmjudge.serve.images import RequestImages
from mmjudge.serve.service import Service


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "teal").save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_request_naming_image_paths_makes_no_directory_and_one_with_a_data_url_removes_its_own(tmp_path, monkeypatch):
    """A one-sample reward request names its image by path: making and deleting a temporary directory for each
    such request was a tenth of its time in the server's event loop."""
    root, scratch = tmp_path / "root", tmp_path / "scratch"
    root.mkdir(), scratch.mkdir()
    (root / "a.png").write_bytes(png())
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    images = RequestImages(root, max_pixels=10_000)
    assert images.file("a.png", "images[0][0]") == root / "a.png"
    assert list(scratch.iterdir()) == []
    images.close()
    images = RequestImages(root, max_pixels=10_000)
    written = images.file("data:image/png;base64," + base64.b64encode(png()).decode(), "images[0][1]")
    assert written.parent.parent == scratch and written.read_bytes() == png()
    assert images.file("data:image/png;base64," + base64.b64encode(png()).decode(), "images[0][2]").parent == written.parent
    images.close()
    assert list(scratch.iterdir()) == []


def test_the_services_image_root_is_resolved_once_so_paths_under_a_linked_root_are_found(tmp_path):
    """RequestImages confines paths to the root it is given, as resolved: the Service resolves --image_root once,
    where a request's images were each resolving it again."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.png").write_bytes(png())
    (tmp_path / "link").symlink_to(real)
    service = Service(("judge",), None, {}, None, None, tmp_path / "link" / ".." / "link", None, None, 0, 0, None, "", "")
    assert service.image_root == real
    assert RequestImages(service.image_root, max_pixels=10_000).file("a.png", "images[0][0]") == real / "a.png"


def test_stamping_a_requests_results_fingerprints_only_its_categories_rubrics(monkeypatch):
    """A server stamps every request's records: hashing each of its rubrics every time was work for none of them."""
    rubrics = load_rubrics()
    hashed = []
    monkeypatch.setattr(identity, "rubric_fingerprint", lambda rubric: hashed.append(rubric) or "f")
    category = next(iter(rubrics))
    result = JudgeResult(id="0", model=None, category=category, feedback="", score=None, criteria={}, n_images=0, n_tiles=0,
                         prompt_tokens=1, generated_tokens=0)
    assert stamp([result], "judge", rubrics)[0].rubric_fingerprint == "f" and hashed == [rubrics[category]] and len(rubrics) > 1
