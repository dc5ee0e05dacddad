"""Fixture repositories for measure-base, made by the tests with real git.

``python_repo``: a pytest suite at two commits. At base the file ``marker``
exists; head removes it. Its tests:

    test_keep   passes at both                    -> passing
    test_pre    fails at both                     -> pre-existing
    test_intro  needs ``marker``: fails at head   -> introduced
    test_fix    needs no ``marker``: passes at head -> fixed
    test_tree   walks the tree and fails if it sees a second copy of the
                package (the design document's tree-walking guard): passes at
                base (in the scratch clone, one copy), fails at head while the
                scratch clone is under the tree, passes once it is removed
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SUITE = '''\
import os


def test_keep():
    assert True


def test_pre():
    assert False, "broken since base"


def test_intro():
    assert os.path.exists("marker")


def test_fix():
    assert not os.path.exists("marker")


def test_tree():
    copies = [root for root, dirs, files in os.walk(".") if "suite_marker.txt" in files]
    assert copies == ["./pkg"], copies
'''


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env=env, check=True)
    return done.stdout.strip()


def python_repo(root: Path, name: str = "repo") -> tuple[Path, str, str]:
    """The repository, its base SHA and its head SHA (HEAD, on main)."""
    repo = root / name
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "pkg").mkdir()
    (repo / "pkg" / "suite_marker.txt").write_text("one copy\n")
    (repo / "test_suite.py").write_text(SUITE)
    (repo / "marker").write_text("base\n")
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "rm", "-q", "marker")
    git(repo, "commit", "-q", "-m", "head")
    return repo, base, git(repo, "rev-parse", "HEAD")


CRATE_LIB = '''\
pub const FLAG: bool = {flag};

#[cfg(test)]
mod tests {{
    use super::FLAG;

    #[test]
    fn keep() {{}}

    #[test]
    fn pre() {{
        panic!("broken since base");
    }}

    #[test]
    fn intro() {{
        assert!(FLAG);
    }}

    #[test]
    fn fixed() {{
        assert!(!FLAG);
    }}
}}
'''


def cargo_repo(root: Path) -> tuple[Path, str, str]:
    """A crate with no dependencies: FLAG true at base, false at head."""
    repo = root / "crate"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "Cargo.toml").write_text(
        '[package]\nname = "fixture"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n')
    (repo / ".gitignore").write_text("/target/\nCargo.lock\n")
    (repo / "src" / "lib.rs").write_text(CRATE_LIB.format(flag="true"))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "src" / "lib.rs").write_text(CRATE_LIB.format(flag="false"))
    git(repo, "commit", "-q", "-am", "head")
    return repo, base, git(repo, "rev-parse", "HEAD")
