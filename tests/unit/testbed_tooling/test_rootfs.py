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
