from tritonfleet_testbed.rootfs import Mirror, parse_apt_sources


def test_deb822_and_one_line_sources():
    files = {
        "/etc/apt/sources.list.d/debian.sources": (
            "Types: deb\n# comment\nURIs: http://mirror.example/debian\n"
            "Suites: bookworm bookworm-updates\nComponents: main contrib\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
            "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\nComponents: main\n"
        ),
        "/etc/apt/sources.list": "deb [arch=amd64] http://other.example/debian/ bookworm main # x\n",
    }
    got = parse_apt_sources(files)
    assert Mirror("http://mirror.example/debian", "bookworm", ("main", "contrib")) in got
    assert Mirror("http://mirror.example/debian", "bookworm-updates", ("main", "contrib")) in got
    assert Mirror("http://other.example/debian", "bookworm", ("main",)) in got
    assert not any("src.example" in m.uri for m in got)


MACHINE = {
    "/etc/apt/sources.list.d/debian.sources": (
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n"
    ),
}


def test_a_release_the_machine_does_not_name_comes_from_its_archive(monkeypatch):
    from tritonfleet_testbed import rootfs

    monkeypatch.setattr(rootfs, "read_apt_sources", lambda root=None: MACHINE)
    assert rootfs.debian_mirror() == Mirror("http://mirror.example/debian", "bookworm", ("main",))
    # trixie from the same archive (not the security one, not a -updates suite)
    assert rootfs.debian_mirror("trixie") == Mirror("http://mirror.example/debian", "trixie", ("main",))
    assert rootfs.machine_suite() == "bookworm"


def test_sources_renamed_to_another_release_keep_everything_else():
    from tritonfleet_testbed.rootfs import retarget_suites

    name, text = next(iter(MACHINE.items()))
    got = retarget_suites(text, name, "bookworm", "trixie")
    assert "Suites: trixie trixie-updates\n" in got and "Suites: trixie-security\n" in got
    assert got.replace("trixie", "bookworm") == text  # only the suites changed
    one_line = "deb [signed-by=/usr/share/keyrings/bookworm-x.gpg] http://m.example/debian bookworm-updates main\n"
    assert retarget_suites(one_line, "/etc/apt/sources.list", "bookworm", "trixie") == (
        "deb [signed-by=/usr/share/keyrings/bookworm-x.gpg] http://m.example/debian trixie-updates main\n")
