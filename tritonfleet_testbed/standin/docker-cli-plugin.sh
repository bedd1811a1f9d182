#!/bin/sh
# Testbed stand-in for the Docker CLI plugin @PLUGIN@ (@PACKAGE@ @VERSION@): it answers the CLI's
# plugin handshake and `docker @COMMAND@ version`, nothing else.
case "$1" in
  docker-cli-plugin-metadata)
    printf '{"SchemaVersion":"0.1.0","Vendor":"Docker Inc.","Version":"v@VERSION@","ShortDescription":"@DESCRIPTION@"}\n'
    exit 0 ;;
esac
[ "$1" = "@COMMAND@" ] && shift  # the CLI runs plugins as `docker-@COMMAND@ @COMMAND@ ARGS`
case "$1" in
  version|--version|-v) echo "@VERSION_LINE@"; exit 0 ;;
esac
echo "docker @COMMAND@: testbed stand-in of @PACKAGE@ @VERSION@: only 'version' is implemented" >&2
exit 1
