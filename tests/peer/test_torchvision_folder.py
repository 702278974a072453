"""The peer runner's own pieces, without torchvision: what it takes out of a test file, how it reads pytest's results."""
from __future__ import annotations

import ast

import pytest

from tests.peer.torchvision_folder import _REBIND, _outcomes, extract, main

FAKE = '''import os
from torchvision import datasets


class OtherTestCase:
    DATASET_CLASS = datasets.MNIST


class DatasetFolderTestCase:
    DATASET_CLASS = datasets.DatasetFolder  # a comment inside stays


def helper():
    pass


class ImageFolderTestCase:
    DATASET_CLASS = datasets.ImageFolder
'''


def test_extract_keeps_the_imports_and_the_two_cases_and_rebinds_datasets_for_cachepipe(tmp_path):
    path = tmp_path / "test_datasets.py"
    path.write_text(FAKE)
    theirs, ours = extract(path, "torchvision"), extract(path, "cachepipe")
    names = [n.name for n in ast.parse(theirs).body if isinstance(n, ast.ClassDef)]
    assert names == ["ImageFolderTestCase", "DatasetFolderTestCase"] and "helper" not in theirs
    assert "# a comment inside stays" in theirs and _REBIND not in theirs
    head, _, rest = ours.partition(_REBIND)
    assert "from torchvision import datasets" in head and "class ImageFolderTestCase" in rest
    path.write_text("import os\n\nclass ImageFolderTestCase:\n    pass\n")
    with pytest.raises(ValueError, match="has no DatasetFolderTestCase"):
        extract(path, "torchvision")


def test_outcomes_read_from_junit_xml(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('''<testsuites><testsuite>
<testcase classname="test_folder_peer.ImageFolderTestCase" name="test_smoke"/>
<testcase classname="test_folder_peer.DatasetFolderTestCase" name="test_allow_empty">
<failure message="AssertionError: Regex pattern did not match.&#10;more">trace</failure></testcase>
<testcase classname="test_folder_peer.ImageFolderTestCase" name="test_x"><skipped message="no av"/></testcase>
</testsuite></testsuites>''')
    assert _outcomes(junit) == {"ImageFolderTestCase.test_smoke": ("passed", ""),
                                "DatasetFolderTestCase.test_allow_empty": ("failed",
                                                                           "AssertionError: Regex pattern did not match."),
                                "ImageFolderTestCase.test_x": ("skipped", "no av")}


def test_a_checkout_without_the_test_files_is_a_flag_error(tmp_path, capsys):
    assert main(["--vision", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"torchvision_folder: error: --vision {tmp_path}: no test/test_datasets.py"
