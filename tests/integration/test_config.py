"""test_config.py — the YAML configuration file (docs/config.md).

`tokentap -t -c FILE` accepts the annotated examples in conf/ (so that they
stay valid as keys are added; the TLS one with generated certificates and
token in place), together they use every key docs/config.md documents, and
for each kind of broken file exits 1
printing `FILE:LINE: message` lines that give the line of the offending key
and name it by its full path; a file with several problems prints each of
them. Command-line misuse exits 2. Flags given beside -c override the file.
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import unittest

import harness
import routing_helpers as rh
import test_tls

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A valid file every broken case starts from. Line numbers below are found
# by searching the final text, never hard-coded.
BASE = """\
listen: 127.0.0.1:0
admin: {listen: "off"}
store: {dir: "off"}
timeouts:
  connect: 2s
limits:
  max_body_size: 1m
upstreams:
  - name: a
    url: http://127.0.0.1:9
  - name: b
    url: http://127.0.0.1:10
routes:
  - name: r
    match:
      path_prefix: /v1/
    split:
      - upstream: a
        weight: 1
      - upstream: b
        weight: 1
"""


def documented_keys(md):
    """The dotted key paths of docs/config.md's tables: the first cell's
    `keys` of each row, under the section's prefix (`## \`store\`` ->
    store.); `.idle` after `timeouts.connect` is timeouts.idle."""
    keys, prefix = set(), None
    for line in md.split("\n"):
        m = re.match(r"^## (.*)$", line)
        if m:
            title = m.group(1).strip()
            prefix = "" if title == "Top level" else (title.strip("`") + "." if title.startswith("`") else None)
            continue
        if prefix is None or not line.startswith("| `"):
            continue
        last = None
        for tok in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if tok.startswith(".") and last:
                tok = last.rsplit(".", 1)[0] + tok
            keys.add(prefix + tok)
            last = tok
    return keys


def flow_keys(text, prefix, out):
    """Keys of a flow mapping `{a: 1, b: {c: 2}}` under `prefix`."""
    text = text.strip()
    if not text.startswith("{"):
        return
    depth, item, items = 0, "", []
    for ch in text[1:-1]:
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += ch in "{["
        depth -= ch in "}]"
        item += ch
    items.append(item)
    for it in items:
        k, sep, v = it.partition(":")
        if sep and k.strip():
            out.add(prefix + k.strip())
            flow_keys(v, prefix + k.strip() + ".", out)


def yaml_key_paths(text):
    """Dotted key paths of a YAML file of block mappings, lists of
    mappings and flow mappings, list positions dropped: upstreams.tls.verify."""
    out, stack = set(), []
    for raw in text.split("\n"):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        body = line.strip()
        while body.startswith("- "):
            indent += 2 + (len(body) - 2 - len(body[2:].lstrip()))
            body = body[2:].lstrip()
        m = re.match(r"^([A-Za-z_][\w-]*):(?:\s+(.*))?$", body)
        if not m:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m.group(1)])
        out.add(path)
        if m.group(2):
            flow_keys(m.group(2), path + ".", out)
        else:
            stack.append((indent, m.group(1)))
    return out


def edit(old, new, text=BASE):
    if old not in text:
        raise AssertionError("edit: %r not in base text" % old)
    return text.replace(old, new, 1)


class ExampleTest(harness.TestCase):
    def test_example_file_is_valid(self):
        # Path relative to the repository root, as the file's own comment
        # and docs/config.md give it.
        self.assertTrue(os.path.exists(os.path.join(REPO, "conf", "tokentap.yaml")))
        res = subprocess.run([harness.tokentap_bin(), "-t", "-c", "conf/tokentap.yaml"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, timeout=10, cwd=REPO, start_new_session=True)
        self.assertEqual(res.returncode, 0, "stdout=%r stderr=%r" % (res.stdout, res.stderr))
        self.assertIn("ok", res.stdout + res.stderr)
        self.assertEqual(rh.problem_lines(res, "conf/tokentap.yaml"), [], res.stderr)

    def test_tls_example_file_is_valid(self):
        """conf/tokentap-tls.yaml names files relative to where tokentap
        runs: checked in a directory where they exist, then refused in one
        where they do not."""
        d = tempfile.mkdtemp(prefix="tokentap-example-")
        self.addCleanup(shutil.rmtree, d, True)
        tls = os.path.join(d, "tls")
        os.mkdir(tls)
        cert, key = test_tls.make_pki(tls)
        os.rename(cert, os.path.join(tls, "fullchain.pem"))
        os.rename(key, os.path.join(tls, "privkey.pem"))
        shutil.copy(os.path.join(tls, "ca.pem"), os.path.join(tls, "upstream-ca.pem"))
        rh.write_file(os.path.join(d, "admin.token"), "example-token-0123456789\n")
        shutil.copy(os.path.join(REPO, "conf", "tokentap-tls.yaml"), d)

        def check(cwd):
            return subprocess.run([harness.tokentap_bin(), "-t", "-c", "tokentap-tls.yaml"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, timeout=10, cwd=cwd, start_new_session=True)

        res = check(d)
        self.assertEqual(res.returncode, 0, "stdout=%r stderr=%r" % (res.stdout, res.stderr))
        self.assertEqual(rh.problem_lines(res, "tokentap-tls.yaml"), [], res.stderr)
        bare = tempfile.mkdtemp(prefix="tokentap-example-bare-")
        self.addCleanup(shutil.rmtree, bare, True)
        shutil.copy(os.path.join(REPO, "conf", "tokentap-tls.yaml"), bare)
        res = check(bare)
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertEqual(len(rh.problem_lines(res, "tokentap-tls.yaml")), 4,
                         res.stderr)  # cert, key, the upstream ca_file, the collector certificate

    def test_examples_use_every_documented_key(self):
        with open(os.path.join(REPO, "docs", "config.md")) as f:
            documented = documented_keys(f.read())
        self.assertGreater(len(documented), 60, sorted(documented))
        used = set()
        for name in ("tokentap.yaml", "tokentap-tls.yaml"):
            with open(os.path.join(REPO, "conf", name)) as f:
                used |= yaml_key_paths(f.read())
        self.assertEqual(sorted(documented - used), [], "documented in docs/config.md, used in no example")
        # and the other way: an example key that is neither documented nor
        # a section holding documented keys (routes.match) nor a field of a
        # documented list entry (split's {upstream, weight}); labels are
        # free-form
        def known(k):
            return (k in documented or any(d.startswith(k + ".") for d in documented)
                    or k.rsplit(".", 1)[0] in documented or k.startswith("upstreams.labels."))
        undocumented = {k for k in used if not known(k)}
        self.assertEqual(sorted(undocumented), [], "used in an example, not documented")

    def test_base_file_is_valid(self):
        res, name = rh.check_config(BASE)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("ok", res.stdout)


class Broken:
    """broken(): the check every broken-file test makes."""

    def broken(self, text, expect, count=1):
        """`expect`: list of (line, [substrings of the message]). Asserts
        exit 1, exactly `count` problem lines, and each expectation met by
        one of them."""
        res, name = rh.check_config(text)
        probs = rh.problem_lines(res, name)
        self.assertEqual(res.returncode, 1, "exit status; stdout=%r stderr=%r" % (res.stdout, res.stderr))
        self.assertNotIn("configuration ok", res.stdout)
        if count is None:  # a follow-on problem may be reported too
            self.assertTrue(probs, "no problem lines:\n%s" % res.stderr)
        else:
            self.assertEqual(len(probs), count, "problem lines:\n%s" % res.stderr)
        for line, subs in expect:
            ok = [p for p in probs if p[0] == line and all(s in p[1] for s in subs)]
            self.assertTrue(ok, "no problem on line %d naming %r; got:\n%s" % (line, subs, res.stderr))
        return probs


class BrokenFileTest(Broken, harness.TestCase):
    def test_unknown_top_level_key(self):
        t = edit("upstreams:\n", "bogus_key: 1\nupstreams:\n")
        self.broken(t, [(rh.line_of(t, "bogus_key"), ["bogus_key"])])

    def test_fixed_sizes_are_not_keys(self):
        # pool_max_idle, stream_buffer and body_inspect_max are constants
        # (POOL_MAX_IDLE, STREAM_BUFFER, BODY_INSPECT_MAX): never settable,
        # so a file naming one is refused like any unknown key, not ignored.
        for key in ("pool_max_idle", "stream_buffer", "body_inspect_max"):
            with self.subTest(key=key):
                t = edit("upstreams:\n", "%s: 1\n" % key + "upstreams:\n")
                self.broken(t, [(rh.line_of(t, key), [key, "unknown key"])])

    def test_unknown_nested_key(self):
        t = edit("    url: http://127.0.0.1:9\n", "    url: http://127.0.0.1:9\n    bogus: 2\n")
        self.broken(t, [(rh.line_of(t, "bogus: 2"), ["upstreams[0].bogus"])])

    def test_unknown_key_in_split(self):
        t = edit("      - upstream: b\n        weight: 1\n", "      - upstream: b\n        wieght: 1\n")
        self.broken(t, [(rh.line_of(t, "wieght"), ["routes[0].split[1].wieght"])])

    def test_list_where_scalar_expected(self):
        t = edit("    url: http://127.0.0.1:10\n", "    url: http://127.0.0.1:10\n    max_concurrency: [1, 2]\n")
        self.broken(t, [(rh.line_of(t, "max_concurrency"), ["upstreams[1].max_concurrency"])])

    def test_scalar_where_mapping_expected(self):
        t = edit("timeouts:\n  connect: 2s\n", "timeouts: 5s\n")
        self.broken(t, [(rh.line_of(t, "timeouts: 5s"), ["timeouts"])])

    def test_scalar_where_mapping_expected_nested(self):
        t = edit("    match:\n      path_prefix: /v1/\n", "    match: /v1/\n")
        self.broken(t, [(rh.line_of(t, "match: /v1/"), ["routes[0].match"])])

    def test_bad_duration(self):
        for bad in ("5 parsecs", "5x", "ms", "-5s", "1.5.2s"):
            with self.subTest(value=bad):
                t = edit("  connect: 2s\n", "  connect: %s\n" % bad)
                self.broken(t, [(rh.line_of(t, "connect:"), ["timeouts.connect"])])

    def test_bad_size(self):
        for bad in ("12q", "lots", "-1k", "1mm"):
            with self.subTest(value=bad):
                t = edit("  max_body_size: 1m\n", "  max_body_size: %s\n" % bad)
                self.broken(t, [(rh.line_of(t, "max_body_size"), ["limits.max_body_size"])])

    def test_store_max_size(self):
        for bad in ("12q", "0", "32k", "65g", "-1g"):
            with self.subTest(value=bad):
                t = edit("store: {dir: \"off\"}\n", "store:\n  dir: \"off\"\n  max_size: %s\n" % bad)
                probs = self.broken(t, [(rh.line_of(t, "max_size"), ["store.max_size"])])
                if bad not in ("12q", "-1g"):
                    self.assertIn("from 64k to 64g", probs[0][1])
        for good in ("64k", "512m", "64g", "4096000"):
            with self.subTest(value=good):
                res, name = rh.check_config(edit("store: {dir: \"off\"}\n",
                                                 "store:\n  dir: \"off\"\n  max_size: %s\n" % good))
                self.assertEqual(res.returncode, 0, res.stderr)

    def test_values_under_a_minimum(self):
        """Values under their row's minimum in the settings table are errors
        naming the range, not silently kept or rounded."""
        cases = [
            ("  max_body_size: 1m\n", "  max_body_size: 1m\n  max_event_size: 0\n", "max_event_size",
             "limits.max_event_size", "at least 1"),
            ("store: {dir: \"off\"}\n", "store: {dir: \"off\", minute_retention: 500ms}\n", "minute_retention",
             "store.minute_retention", "at least 1s"),
            ("store: {dir: \"off\"}\n", "store: {dir: \"off\", max_models: 0}\n", "max_models",
             "store.max_models", "at least 1"),
        ]
        for old, new, marker, path, says in cases:
            with self.subTest(path=path):
                t = edit(old, new)
                self.broken(t, [(rh.line_of(t, marker), [path, says])])

    def test_values_that_do_not_parse(self):
        cases = [
            ("listen: 127.0.0.1:0\n", "listen: localhost:http\n", "listen: localhost", "listen"),
            ("store: {dir: \"off\"}\n", "store: {dir: \"off\"}\nlog_level: loud\n", "log_level: loud",
             "log_level"),
            ("admin: {listen: \"off\"}\n", "admin: {listen: \"admin.example:9901\"}\n", "admin:",
             "admin.listen"),
            ("      - upstream: b\n        weight: 1\n", "      - upstream: b\n        weight: -1\n",
             "weight: -1", "routes[0].split[1].weight"),
            ("      - upstream: b\n        weight: 1\n", "      - upstream: b\n        weight: half\n",
             "weight: half", "routes[0].split[1].weight"),
            ("      path_prefix: /v1/\n", "      path_prefix: /v1/\n    failover: maybe\n", "failover: maybe",
             "routes[0].failover"),
            ("    url: http://127.0.0.1:10\n", "    url: ftp://127.0.0.1:10\n", "ftp://", "upstreams[1].url"),
            ("    url: http://127.0.0.1:10\n", "    url: http://127.0.0.1:10\n    max_concurrency: lots\n",
             "max_concurrency: lots", "upstreams[1].max_concurrency"),
        ]
        for old, new, marker, path in cases:
            with self.subTest(path=path, value=marker):
                t = edit(old, new)
                self.broken(t, [(rh.line_of(t, marker), [path])])

    def test_list_key_messages_whole(self):
        """One key of each kind the list tables read (loader.c's rows: a
        count with a range, an enum, a count, a duration, a bool, an
        address, a list, a section), its whole message as users see it."""
        cases = [
            ("      path_prefix: /v1/\n", "      path_prefix: /v1/\n    prefix_blocks: 2000\n", "prefix_blocks",
             "routes[0].prefix_blocks: expected from 1 to 1024 blocks, got 2000"),
            ("      path_prefix: /v1/\n", "      path_prefix: /v1/\n    balance: fastest\n", "balance",
             "routes[0].balance: expected weighted, least_request, latency or prefix, got 'fastest'"),
            ("      - upstream: b\n        weight: 1\n", "      - upstream: b\n        weight: half\n", "weight: half",
             "routes[0].split[1].weight: expected a whole number, got 'half'"),
            ("    url: http://127.0.0.1:9\n", "    url: http://127.0.0.1:9\n    max_concurrency: 1\n    queue: {max: 2, timeout: 0s}\n", "queue:",
             "upstreams[0].queue.timeout: expected a positive duration such as 300ms or 5s (at most 87600h), "
             "got '0s'"),
            ("    url: http://127.0.0.1:9\n", "    url: https://127.0.0.1:9\n    tls: {verify: maybe}\n", "tls:",
             "upstreams[0].tls.verify: expected true or false, got 'maybe'"),
            ("    url: http://127.0.0.1:9\n", "    url: https://127.0.0.1:9\n    tls: on\n", "tls: on",
             "upstreams[0].tls: expected a mapping of keys to values"),
            ("listen: 127.0.0.1:0\n", "listeners:\n  - address: localhost:1\n", "address:",
             "listeners[0].address: expected a numeric ADDR:PORT such as 127.0.0.1:8080"),
            ("listen: 127.0.0.1:0\n", "listeners: {address: 127.0.0.1:0}\n", "listeners:",
             "listeners: expected a list of {address, tls}"),
            ("    url: http://127.0.0.1:9\n", "    url: http://127.0.0.1:9\n    eject: {backoff: 5s, max_backoff: 1s}\n",
             "eject:", "upstreams[0].eject: max_backoff (1000ms) is shorter than backoff (5000ms); "
             "make it at least as long"),
        ]
        for old, new, marker, message in cases:
            with self.subTest(message=message):
                t = edit(old, new)
                self.broken(t, [(rh.line_of(t, marker), [])])
                res, name = rh.check_config(t)
                self.assertEqual([m for _, m in rh.problem_lines(res, name)], [message])

    def test_scalar_where_list_expected(self):
        t = BASE[:BASE.index("routes:")] + "routes: 5\n"
        # "no routes" may follow as a consequence; the type error must be there.
        self.broken(t, [(rh.line_of(t, "routes: 5"), ["routes"])], count=None)

    def test_route_names_undefined_upstream(self):
        t = edit("      - upstream: b\n", "      - upstream: nope\n")
        # The problem is the reference: its line, its key path, the name.
        self.broken(t, [(rh.line_of(t, "upstream: nope"), ["routes[0].split[1].upstream", "nope"])])

    def test_single_upstream_route_names_undefined_upstream(self):
        t = BASE + "  - name: r2\n    upstream: ghost\n"
        self.broken(t, [(rh.line_of(t, "upstream: ghost"), ["routes[1].upstream", "ghost"])])

    def test_weights_add_up_to_zero(self):
        t = BASE.replace("weight: 1", "weight: 0")
        res, name = rh.check_config(t)
        probs = rh.problem_lines(res, name)
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertEqual(len(probs), 1, res.stderr)
        # No single key is wrong: the line is the route's, somewhere from
        # its entry to its last weight, and the message names routes[0].
        first, last = rh.line_of(t, "  - name: r"), len(t.rstrip("\n").split("\n"))
        line, msg = probs[0]
        self.assertTrue(first <= line <= last, "line %d not within the route (%d..%d)" % (line, first, last))
        self.assertIn("routes[0]", msg, res.stderr)

    def test_mirror_that_is_a_target_of_its_route(self):
        t = edit("      - upstream: b\n        weight: 1\n",
                 "      - upstream: b\n        weight: 1\n    mirror:\n      upstream: b\n")
        self.broken(t, [(rh.line_of(t, "upstream: b", nth=2), ["routes[0].mirror.upstream", "b", "target"])])

    def test_mirror_max_in_flight(self):
        t = edit("      - upstream: b\n        weight: 1\n",
                 "      - upstream: b\n        weight: 1\n  - name: m\n    upstream: a\n"
                 "    mirror: {upstream: b, max_in_flight: 0}\n")
        self.broken(t, [(rh.line_of(t, "max_in_flight"), ["routes[1].mirror.max_in_flight"])])
        res, _ = rh.check_config(t.replace("max_in_flight: 0", "max_in_flight: 16"))
        self.assertEqual(res.returncode, 0, res.stderr)

    def test_duplicate_keys(self):
        cases = [
            (edit("timeouts:\n  connect: 2s\n", "timeouts:\n  connect: 2s\n  connect: 3s\n"), "connect: 3s",
             ["timeouts.connect", "twice"]),
            (edit("limits:\n", "timeouts: {idle: 5s}\nlimits:\n"), "timeouts: {idle", ["timeouts", "twice"]),
            (edit("    url: http://127.0.0.1:10\n", "    url: http://127.0.0.1:10\n    name: c\n"), "name: c",
             ["upstreams[1].name", "twice"]),
            (edit("    url: http://127.0.0.1:10\n",
                  "    url: http://127.0.0.1:10\n    labels: {gpu: a, gpu: b}\n"), "labels:",
             ["upstreams[1].labels.gpu", "twice"]),
        ]
        for t, marker, subs in cases:
            with self.subTest(marker=marker):
                self.broken(t, [(rh.line_of(t, marker), subs)])

    def test_sticky_with_header_and_json_field(self):
        t = edit("      path_prefix: /v1/\n", "      path_prefix: /v1/\n    sticky:\n      header: x-s\n"
                 "      json_field: user\n")
        self.broken(t, [(rh.line_of(t, "json_field"), ["routes[0].sticky", "not both"])])

    def test_same_upstream_twice_in_a_split(self):
        t = edit("      - upstream: b\n", "      - upstream: a\n")
        self.broken(t, [(rh.line_of(t, "- upstream: a", nth=2), ["routes[0].split[1].upstream", "a", "split[0]"])])

    def test_a_split_over_64_upstreams_and_no_more(self):
        # a pick marks the targets it tried in 64 bits: 64 is the most a
        # route may split over, and 65 is refused with the bound named
        def conf(n):
            ups = "".join("  - name: u%d\n    url: http://127.0.0.1:%d\n" % (i, 10000 + i) for i in range(n))
            split = "".join("      - upstream: u%d\n" % i for i in range(n))
            return ("listen: 127.0.0.1:0\nupstreams:\n" + ups + "routes:\n  - name: wide\n    match: {path_prefix: /}\n"
                    "    split:\n" + split)
        res, _ = rh.check_config(conf(64))
        self.assertEqual(res.returncode, 0, res.stderr)
        t = conf(65)
        self.broken(t, [(rh.line_of(t, "- upstream: u0"), ["routes[0].split", "at most 64 upstreams"])])

    def test_listen_with_listeners(self):
        t = edit("listen: 127.0.0.1:0\n", "listen: 127.0.0.1:0\nlisteners:\n  - address: 127.0.0.1:0\n")
        self.broken(t, [(rh.line_of(t, "listen:"), ["listen", "listeners"])])

    def test_tls_settings_on_an_http_url(self):
        for tls in ("{verify: false}", "{ca_file: %s}" % os.path.join(REPO, "README.md"), "{server_name: x}"):
            with self.subTest(tls=tls):
                t = edit("    url: http://127.0.0.1:10\n", "    url: http://127.0.0.1:10\n    tls: %s\n" % tls)
                self.broken(t, [(rh.line_of(t, "tls:"), ["upstreams[1].tls", "https://"])], count=None)

    def test_duplicate_upstream_names(self):
        t = edit("routes:\n", "  - name: a\n    url: http://127.0.0.1:11\nroutes:\n")
        self.broken(t, [(rh.line_of(t, "- name: a", nth=2), ["upstreams[2].name", "a"])])

    def test_names_longer_than_128_bytes(self):
        # A series is stored under route + upstream + model as one LMDB key
        # (at most 511 bytes): names are bounded so that every key fits.
        long_up, long_route = "u" * 129, "r" * 129
        t = BASE.replace("- name: b\n", "- name: %s\n" % long_up).replace("upstream: b\n", "upstream: %s\n" % long_up)
        t = t.replace("- name: r\n", "- name: %s\n" % long_route)
        self.broken(t, [(rh.line_of(t, "- name: " + long_up), ["upstreams[1].name", "at most 128 bytes"]),
                        (rh.line_of(t, "- name: " + long_route), ["routes[0].name", "at most 128 bytes"])],
                    count=2)
        ok = BASE.replace("- name: b\n", "- name: %s\n" % ("u" * 128)).replace("upstream: b\n",
                                                                           "upstream: %s\n" % ("u" * 128))
        res, _ = rh.check_config(ok)
        self.assertEqual(res.returncode, 0, res.stderr)

    def test_missing_url(self):
        t = edit("    url: http://127.0.0.1:10\n", "    max_concurrency: 4\n")
        self.broken(t, [(rh.line_of(t, "- name: b"), ["upstreams[1]", "url"])])

    def test_yaml_syntax_error(self):
        t = edit("    url: http://127.0.0.1:10\n", "     url: http://127.0.0.1:10\n")
        self.broken(t, [(rh.line_of(t, "     url: http://127.0.0.1:10"), [])])

    def test_empty_file(self):
        for text in ("", "# nothing but a comment\n\n"):
            with self.subTest(text=text):
                res, name = rh.check_config(text)
                probs = rh.problem_lines(res, name)
                self.assertEqual(res.returncode, 1, res.stderr)
                self.assertTrue(probs, res.stderr)
                self.assertTrue(any("empty" in m for _, m in probs), res.stderr)

    def test_missing_file(self):
        res = harness.run_cli(["-t", "-c", "does-not-exist.yaml"])
        self.assertEqual(res.returncode, 1, res.stderr)
        self.assertIn("does-not-exist.yaml", res.stderr)

    def test_several_problems_all_reported(self):
        t = BASE
        t = edit("upstreams:\n", "bogus_key: 1\nupstreams:\n", t)
        t = edit("    url: http://127.0.0.1:9\n", "    url: http://127.0.0.1:9\n    bogus: 2\n", t)
        t = edit("  connect: 2s\n", "  connect: soon\n", t)
        t = edit("  max_body_size: 1m\n", "  max_body_size: big\n", t)
        t = edit("      - upstream: b\n", "      - upstream: nope\n", t)
        expect = [
            (rh.line_of(t, "bogus_key"), ["bogus_key"]),
            (rh.line_of(t, "bogus: 2"), ["upstreams[0].bogus"]),
            (rh.line_of(t, "connect: soon"), ["timeouts.connect"]),
            (rh.line_of(t, "max_body_size: big"), ["limits.max_body_size"]),
        ]
        probs = self.broken(t, expect, count=5)
        # The undefined upstream: its exact line is test_route_names_undefined_upstream's
        # business; here it only has to be one of the five, within the route.
        first = rh.line_of(t, "  - name: r")
        self.assertTrue([p for p in probs if "nope" in p[1] and p[0] >= first], probs)

    def test_problems_name_the_file_as_given(self):
        res, name = rh.check_config("bogus: 1\n", name="odd name.yaml")
        self.assertEqual(res.returncode, 1)
        self.assertTrue(rh.problem_lines(res, "odd name.yaml"), res.stderr)


class ServerChecksTest(Broken, harness.TestCase):
    """-t runs the checks the server runs when it starts: the upstream URL
    through the server's own parser, and the TLS files by building their
    contexts. Each refusal the server would give is a FILE:LINE here."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tokentap-cfgtls-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.cert, cls.key = test_tls.make_pki(cls.dir)
        cls.other_cert, cls.other_key = test_tls.make_pki(cls.dir, name="other")
        cls.ca = os.path.join(cls.dir, "ca.pem")
        cls.missing = os.path.join(cls.dir, "missing.pem")

    def test_urls_the_server_refuses(self):
        for url, subs in (("http://127.0.0.1:99999", ["port from 1 to 65535"]),
                          ("http://127.0.0.1:0", ["port from 1 to 65535"]),
                          ("http://h:80/v1", ["path"]),
                          ("http://h/v1/", ["path"]),
                          ("http://:80", ["no host"]),
                          ("http://%s:80" % ("h" * 300), ["longer than 255"]),
                          ("http://[::1", ["IPv6"]),
                          ("ftp://127.0.0.1:10", ["http://"])):
            with self.subTest(url=url):
                t = edit("    url: http://127.0.0.1:10\n", "    url: %s\n" % url)
                self.broken(t, [(rh.line_of(t, url), ["upstreams[1].url"] + subs)])
        for url in ("http://127.0.0.1:10/", "https://h", "http://[::1]:8000", "http://localhost"):
            with self.subTest(url=url):
                res, _ = rh.check_config(edit("    url: http://127.0.0.1:10\n", "    url: %s\n" % url))
                self.assertEqual(res.returncode, 0, res.stderr)

    def test_missing_ca_file(self):
        t = edit("    url: http://127.0.0.1:10\n",
                 "    url: https://127.0.0.1:10\n    tls: {ca_file: %s}\n" % self.missing)
        self.broken(t, [(rh.line_of(t, "ca_file"), ["upstreams[1].tls.ca_file", "cannot read", self.missing])])

    def test_ca_file_that_is_no_certificate(self):
        t = edit("    url: http://127.0.0.1:10\n",
                 "    url: https://127.0.0.1:10\n    tls:\n      ca_file: %s\n" % os.path.join(self.dir, "ext.cnf"))
        self.broken(t, [(rh.line_of(t, "ca_file"), ["upstreams[1].tls.ca_file", "TLS CA file"])])

    def test_otlp_certificate_checked(self):
        """The collector's CA is read when the exporter starts; -t reads it
        the same way, so a missing file or one that holds no certificate is
        a FILE:LINE here, not a start that exports nothing."""
        for path, subs in ((self.missing, ["cannot read", self.missing]),
                           (os.path.join(self.dir, "ext.cnf"), ["TLS CA file"])):
            with self.subTest(path=path):
                t = edit("listen: 127.0.0.1:0\n",
                         "listen: 127.0.0.1:0\ntracing:\n  otlp:\n    endpoint: https://127.0.0.1:4318/v1/traces\n"
                         "    certificate: %s\n" % path)
                self.broken(t, [(rh.line_of(t, "certificate:"), ["tracing.otlp.certificate"] + subs)])
        t = edit("listen: 127.0.0.1:0\n",
                 "listen: 127.0.0.1:0\ntracing:\n  otlp:\n    endpoint: https://127.0.0.1:4318/v1/traces\n"
                 "    certificate: %s\n" % self.ca)
        res, _ = rh.check_config(t)
        self.assertEqual(res.returncode, 0, res.stderr)

    def test_missing_listener_cert_and_key(self):
        t = edit("listen: 127.0.0.1:0\n",
                 "listeners:\n  - address: 127.0.0.1:0\n    tls:\n      cert: %s\n      key: %s\n"
                 % (self.missing, self.missing + ".key"))
        self.broken(t, [(rh.line_of(t, "cert:"), ["listeners[0].tls.cert", "cannot read"]),
                        (rh.line_of(t, "key:"), ["listeners[0].tls.key", "cannot read"])], count=2)

    def test_key_that_does_not_match(self):
        t = edit("listen: 127.0.0.1:0\n",
                 "listen: 127.0.0.1:0\ntls:\n  cert: %s\n  key: %s\n" % (self.cert, self.other_key))
        self.broken(t, [(rh.line_of(t, "cert:"), ["tls", "mismatch"])])

    def test_good_tls_files(self):
        t = edit("listen: 127.0.0.1:0\n",
                 "listeners:\n  - address: 127.0.0.1:0\n    tls: {cert: %s, key: %s}\n" % (self.cert, self.key))
        t = edit("    url: http://127.0.0.1:10\n", "    url: https://127.0.0.1:10\n    tls: {ca_file: %s}\n" % self.ca,
                 t)
        res, _ = rh.check_config(t)
        self.assertEqual(res.returncode, 0, res.stderr)


class CommandLineTest(harness.TestCase):
    def test_t_without_c(self):
        res = harness.run_cli(["-t"])
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertTrue(res.stderr.strip())

    def test_upstream_with_c(self):
        d = self._file(BASE)
        for extra in (["-t"], []):
            with self.subTest(extra=extra):
                res = harness.run_cli(extra + ["-c", d, "--upstream", "http://127.0.0.1:9"], timeout=10)
                self.assertEqual(res.returncode, 2, "stdout=%r stderr=%r" % (res.stdout, res.stderr))

    def test_bad_flag_beside_good_file(self):
        d = self._file(BASE)
        res = harness.run_cli(["-t", "-c", d, "--max-body-size", "12q"])
        self.assertEqual(res.returncode, 2, res.stderr)

    def _file(self, text):
        d = tempfile.mkdtemp(prefix="tokentap-cfg-")
        self.addCleanup(shutil.rmtree, d, True)
        return rh.write_file(os.path.join(d, "t.yaml"), text)


class OverrideTest(harness.TestCase):
    """Flags beside -c win over the file."""

    def test_listen_flag_overrides_file(self):
        # The file names a port held by this test (bind would fail); the
        # flag's ephemeral port must be used instead.
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(holder.close)
        holder.bind((harness.LOOPBACK, 0))
        holder.listen(1)
        busy = holder.getsockname()[1]
        sim = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "2")
        body = rh.upstreams_yaml({"s": sim.url})
        text = ("listen: 127.0.0.1:%d\nadmin: {listen: \"off\"}\nstore: {dir: \"off\"}\n"
                "limits:\n  max_body_size: 32m\n" % busy) + body
        tt = rh.ConfTokentap(text, "--listen", "127.0.0.1:0", "--max-body-size", "1k", header=False)
        self.addCleanup(lambda: harness._stop_and_check(tt))
        self.assertNotEqual(tt.port, busy)
        resp = rh.send(tt.port, rh.chat(), harness.sim_headers(tokens=2))
        self.assertEqual(resp.status, 200, resp.body[:200])
        # --max-body-size 1k over the file's 32m.
        before = sim.stats()["requests"]
        resp = rh.send(tt.port, rh.chat(prompt="x" * 2000), harness.sim_headers(tokens=2))
        self.assertProxyError(resp, 413)
        self.assertEqual(sim.stats()["requests"], before)

    def test_file_listen_used_without_flag(self):
        port = harness.free_port()
        sim = harness.start_sim(self, "--ttft-ms", "0", "--itl-ms", "0", "--tokens", "2")
        text = ("listen: 127.0.0.1:%d\nadmin: {listen: \"off\"}\nstore: {dir: \"off\"}\n" % port
                + rh.upstreams_yaml({"s": sim.url}))
        tt = rh.ConfTokentap(text, header=False)
        self.addCleanup(lambda: harness._stop_and_check(tt))
        self.assertEqual(tt.port, port)


if __name__ == "__main__":
    unittest.main()
