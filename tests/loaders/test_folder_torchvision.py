"""CachedImageFolder and torchvision (issue 32, item 19): a torchvision ``ImageFolder`` (so a
``VisionDataset``) where torchvision imports, a plain torch ``Dataset`` that works the same
where it does not or where its install is broken (NOTE [torchvision base class] in
loaders/folder.py; the decision is ``loaders._optional.torchvision_datasets``).

torchvision's own ``ImageFolderTestCase`` against ``CachedImageFolder(output="pil")`` was run
in a separate venv with torchvision (docs/loaders.md); here the contract is pinned where
torchvision imports and skipped with the reason otherwise, and the other tests need no
torchvision.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image

from loaders import CachedImageFolder
from loaders._optional import torchvision_datasets

NO_TORCHVISION = "torchvision does not import here (not installed in the project's venv)"


@pytest.mark.skipif(torchvision_datasets() is None, reason=NO_TORCHVISION)
def test_with_torchvision_it_is_an_image_folder_that_the_v2_wrapper_accepts(source, cache_dir):
    from torchvision import datasets, tv_tensors
    from torchvision.transforms import v2

    ds = CachedImageFolder(source, v2.Resize((12, 34)), lambda t: t + 100, cache_dir=cache_dir, redis=False,
                           cache_size=40, output="pil")
    assert isinstance(ds, datasets.VisionDataset) and isinstance(ds, datasets.ImageFolder)
    assert isinstance(str(ds), str) and ds.transforms is not None
    img, target = ds[3]
    assert isinstance(img, Image.Image) and img.size == (34, 12) and target == ds.targets[3] + 100
    wrapped = datasets.wrap_dataset_for_transforms_v2(ds)
    assert isinstance(wrapped, CachedImageFolder) and len(wrapped) == len(ds)
    img, target = wrapped[3]
    assert isinstance(img, (Image.Image, tv_tensors.TVTensor)) and target == ds.targets[3] + 100


def _run(code: str, path_first: str | None = None) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.path.insert(0, {path_first!r})\n" if path_first else ""
    return subprocess.run([sys.executable, "-W", "always", "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_without_torchvision_it_is_a_torch_dataset_that_works_the_same(source, cache_dir):
    res = _run(f"""
        import sys
        sys.modules["torchvision"] = None  # as if not installed
        import numpy as np, torch
        from loaders import CachedImageFolder
        ds = CachedImageFolder({str(source)!r}, cache_dir={str(cache_dir)!r}, redis=False, cache_size=40, output="pil")
        assert type(ds).__mro__[1] is torch.utils.data.Dataset and ds.transforms is None
        img, target = ds[3]
        print(type(img).__name__, img.size, target, np.asarray(img).mean())
    """)
    assert res.returncode == 0, res.stderr
    assert "torchvision" not in res.stderr  # nothing to warn about
    ds = CachedImageFolder(source, cache_dir=cache_dir, redis=False, cache_size=40, output="pil")
    img, target = ds[3]
    assert res.stdout.split()[0] == "Image" and int(res.stdout.split()[-2]) == target
    assert float(res.stdout.split()[-1]) == pytest.approx(np.asarray(img).mean())


def test_a_torchvision_that_does_not_import_is_named_once_and_loaders_still_work(tmp_path, source, cache_dir):
    broken = tmp_path / "site" / "torchvision"  # what PyPI's torchvision does beside another torch build
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    res = _run(f"""
        import torch
        from loaders import CachedImageFolder, cached_dataloader
        ds = CachedImageFolder({str(source)!r}, cache_dir={str(cache_dir)!r}, redis=False, cache_size=40)
        assert type(ds).__mro__[1] is torch.utils.data.Dataset
        print(min(ds[0][0].shape[:2]))
    """, path_first=str(tmp_path / "site"))
    assert res.returncode == 0, res.stderr
    warned = [line for line in res.stderr.splitlines() if "torchvision is installed but does not import" in line]
    assert len(warned) == 1 and "RuntimeError: operator torchvision::nms does not exist" in warned[0]
    assert res.stdout.split() == ["40"]  # a cached sample, shorter side cache_size
