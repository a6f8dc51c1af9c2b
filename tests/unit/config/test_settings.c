/*
 * test_settings.c — the settings table (settings.h): every default parses
 * and lies in its row's range, config_defaults gives the values tokentap has
 * always started with, each type's parser keeps its range and messages, and
 * --help shows every flag once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "loader.h"
#include "log.h"
#include "settings.h"

static uint64_t numeric(const struct setting *s, const struct config *c)
{
	const void *f = (const char *)c + s->offset;
	switch (s->type) {
	case ST_SIZE:
	case ST_DURATION:
	case ST_DURATION_S:
	case ST_DURATION_OFF: return *(const uint64_t *)f;
	case ST_UINT:
	case ST_WORKERS: return *(const unsigned *)f;
	default: return 0;
	}
}

static void test_every_default_parses_in_range(void **state)
{
	(void)state;
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		struct config c;
		char why[200] = "";

		assert_int_equal(s->id, (int)i);
		assert_non_null(s->help);
		if (s->flag && s->type != ST_FLAG)
			assert_non_null(s->metavar);
		if (!s->def)
			continue;
		memset(&c, 0, sizeof(c));
		if (setting_parse(s, s->def, &c, why, sizeof(why)) == -1)
			fail_msg("%s: default '%s' does not parse: %s", s->name, s->def, why);
		if (s->max)
			assert_true(s->min <= s->max);
		if (s->type == ST_DURATION_S) /* its range is on the milliseconds */
			continue;
		uint64_t v = numeric(s, &c);
		if (v < s->min || (s->max && v > s->max))
			fail_msg("%s: default %s is outside its range", s->name, s->def);
	}
}

/* The values config_defaults wrote by hand before the table. */
static void test_defaults_are_todays(void **state)
{
	struct config c;
	(void)state;
	config_defaults(&c);
	assert_string_equal(c.listen, "127.0.0.1:8080");
	assert_int_equal(c.log_level, LOG_INFO);
	assert_int_equal(c.max_body_size, 32u << 20);
	assert_int_equal(c.max_header_size, 32u << 10);
	assert_int_equal(c.max_headers, 100);
	assert_int_equal(c.max_connections, 10000);
	assert_int_equal(c.header_timeout_ms, 30000);
	assert_int_equal(c.body_timeout_ms, 60000);
	assert_int_equal(c.keepalive_timeout_ms, 75000);
	assert_int_equal(c.connect_timeout_ms, 5000);
	assert_int_equal(c.first_byte_timeout_ms, 300000);
	assert_int_equal(c.idle_timeout_ms, 300000);
	assert_int_equal(c.pool_idle_timeout_ms, 60000);
	assert_int_equal(c.max_event_size, 1u << 20);
	assert_string_equal(c.data_dir, "tokentap-data");
	assert_int_equal(c.flush_ms, 1000);
	assert_int_equal(c.max_models, 32);
	assert_int_equal(c.model_idle_ms, 24 * 3600 * 1000ull);
	assert_int_equal(c.slo_ttft_ms, 2000);
	assert_int_equal(c.slo_tpot_ms, 100);
	assert_int_equal(c.slo_itl_ms, 0);
	assert_int_equal(c.cold_idle_ms, 60000);
	assert_int_equal(c.minute_retention_s, 24 * 3600);
	assert_int_equal(c.hour_retention_s, 30 * 24 * 3600);
	assert_int_equal(c.store_max_size, STORE_MAX_SIZE_MAX);
	assert_string_equal(c.admin_listen, "127.0.0.1:9901");
	assert_int_equal(c.shutdown_grace_ms, 30000);
	assert_int_equal(c.workers, 0);
	assert_null(c.upstream);
	assert_null(c.access_log);
	assert_null(c.tls_cert);
	assert_null(c.tls_key);
	assert_null(c.admin_token_file);
	assert_null(c.override_header);
	assert_false(c.override_any_upstream);
	assert_false(c.check_data);
	assert_false(c.admin_listen_explicit);
	assert_int_equal(c.nlisteners, 0);
	config_free(&c);
}

static void expect_bad(enum setting_id id, const char *text, const char *why_has)
{
	struct config c;
	char why[400] = "";
	struct config before;
	config_defaults(&c);
	memcpy(&before, &c, sizeof(c));
	if (setting_parse(&settings[id], text, &c, why, sizeof(why)) != -1)
		fail_msg("%s: '%s' was accepted", settings[id].name, text);
	assert_memory_equal(&before, &c, sizeof(c)); /* a refused value changes nothing */
	if (!strstr(why, why_has))
		fail_msg("%s: '%s': message '%s' lacks '%s'", settings[id].name, text, why, why_has);
}

/* Every duration, whatever its row, is at most 87600h (10 years): a
 * larger one (99999999999h is 3.6e17 ms, past 2^64 once made µs) is
 * refused with the bound in the message; the bound itself is accepted. */
static void test_durations_bounded(void **state)
{
	struct config c;
	char why[400];
	uint64_t ms;
	(void)state;

	assert_int_equal(config_parse_duration_ms("87600h", &ms), 0);
	assert_int_equal(ms, 87600ull * 3600000);
	assert_int_equal(config_parse_duration_ms("315360000s", &ms), 0);
	assert_int_equal(config_parse_duration_ms("87601h", &ms), -1);
	assert_int_equal(config_parse_duration_ms("315360001", &ms), -1);
	assert_int_equal(config_parse_duration_ms("99999999999h", &ms), -1);
	assert_int_equal(config_parse_duration_ms("18446744073709551615ms", &ms), -1);
	for (size_t i = 0; i < S__COUNT; i++) {
		enum setting_type t = settings[i].type;
		if (t != ST_DURATION && t != ST_DURATION_S && t != ST_DURATION_OFF)
			continue;
		if (settings[i].max && settings[i].max < 87600ull * 3600000)
			continue; /* a tighter bound of its own */
		expect_bad((enum setting_id)i, "99999999999h", "at most 87600h");
		expect_bad((enum setting_id)i, "87601h", "at most 87600h");
		config_defaults(&c);
		if (setting_parse(&settings[i], "87600h", &c, why, sizeof(why)) != 0)
			fail_msg("%s: 87600h refused: %s", settings[i].name, why);
	}
}

static void test_ranges_hold(void **state)
{
	(void)state;
	expect_bad(S_MAX_HEADER_SIZE, "255", "expected a size from 256 to 1g, such as 32k");
	expect_bad(S_MAX_HEADER_SIZE, "1025m", "from 256 to 1g");
	expect_bad(S_MAX_BODY_SIZE, "12q", "expected a size such as 32m");
	expect_bad(S_HEADER_TIMEOUT, "0s", "expected a positive duration such as 300ms or 5s");
	expect_bad(S_SLO_ITL, "0", "expected a positive duration such as 300ms or 5s, or off");
	expect_bad(S_BODY_TIMEOUT, "-3s", "positive duration");
	expect_bad(S_WORKERS, "65", "auto or a number of threads from 1 to 64");
	expect_bad(S_WORKERS, "0", "from 1 to 64");
	expect_bad(S_LOG_LEVEL, "loud", "error, warn, info or debug");
	expect_bad(S_LISTEN, "localhost:8080", "a numeric ADDR:PORT such as 127.0.0.1:8080 or [::1]:8080");
	expect_bad(S_STORE_MAX_SIZE, "32k", "from 64k to 64g");
	expect_bad(S_STORE_MAX_SIZE, "65g", "from 64k to 64g");
	expect_bad(S_MAX_HEADERS, "0", "at least 1");
	expect_bad(S_MAX_EVENT_SIZE, "0", "expected a size of at least 1, such as 1m");
	expect_bad(S_MAX_MODELS, "0", "expected a whole number of at least 1");
	/* admin.listen is parsed where it is read, as the admin API does when it starts */
	expect_bad(S_ADMIN_LISTEN, "nonsense", "expected ADDR:PORT with an IP address or localhost");
	expect_bad(S_ADMIN_LISTEN, "127.0.0.1:70000", "such as 127.0.0.1:9901");
	expect_bad(S_ADMIN_LISTEN, "admin.example:9901", "or off");
	expect_bad(S_MINUTE_RETENTION, "500ms", "expected a duration of at least 1s, such as 24h");
	expect_bad(S_HOUR_RETENTION, "0", "expected a duration of at least 1s, such as 720h");
	expect_bad(S_WORKLOAD_MAX_SIZE, "4095", "expected a size of at least 4k, such as 256m");
	expect_bad(S_MAX_CONNECTIONS, "1000000001", "whole number");
	expect_bad(S_OVERRIDE_ANY_UPSTREAM, "maybe", "true or false");
	expect_bad(S_UPSTREAM, "ftp://127.0.0.1:21", "expected a URL like http://127.0.0.1:8000");

	struct config c;
	char why[200];
	config_defaults(&c);
	assert_int_equal(setting_parse(&settings[S_MAX_HEADER_SIZE], "1g", &c, why, sizeof(why)), 0);
	assert_int_equal(c.max_header_size, 1u << 30);
	assert_int_equal(setting_parse(&settings[S_MAX_HEADER_SIZE], "256", &c, why, sizeof(why)), 0);
	assert_int_equal(setting_parse(&settings[S_WORKERS], "auto", &c, why, sizeof(why)), 0);
	assert_int_equal(c.workers, 0);
	/* slo.itl can be set back to "not checked", its default */
	assert_int_equal(setting_parse(&settings[S_SLO_ITL], "250ms", &c, why, sizeof(why)), 0);
	assert_int_equal(c.slo_itl_ms, 250);
	assert_int_equal(setting_parse(&settings[S_SLO_ITL], "off", &c, why, sizeof(why)), 0);
	assert_int_equal(c.slo_itl_ms, 0);
	assert_int_equal(setting_parse(&settings[S_ADMIN_LISTEN], "localhost:9901", &c, why, sizeof(why)), 0);
	assert_string_equal(c.admin_listen, "localhost:9901");
	assert_int_equal(setting_parse(&settings[S_ADMIN_LISTEN], "[::1]:0", &c, why, sizeof(why)), 0);
	assert_int_equal(setting_parse(&settings[S_DATA_DIR], "off", &c, why, sizeof(why)), 0);
	assert_null(c.data_dir);
	assert_int_equal(setting_parse(&settings[S_MINUTE_RETENTION], "1500ms", &c, why, sizeof(why)), 0);
	assert_int_equal(c.minute_retention_s, 1);
	config_free(&c);
}

static void test_flag_side_effects(void **state)
{
	struct config c;
	char why[200];
	(void)state;
	config_defaults(&c);
	c.nlisteners = 2;
	assert_int_equal(settings_apply_flag(&settings[S_LISTEN], "[::1]:0", &c, why, sizeof(why)), 0);
	assert_int_equal(c.nlisteners, 0);
	assert_int_equal(settings_apply_flag(&settings[S_ADMIN_LISTEN], "off", &c, why, sizeof(why)), 0);
	assert_null(c.admin_listen);
	assert_true(c.admin_listen_explicit);
	/* --access-log off is no log, as in the file (not a file named "off") */
	c.access_log = "a.log";
	assert_int_equal(settings_apply_flag(&settings[S_ACCESS_LOG], "off", &c, why, sizeof(why)), 0);
	assert_null(c.access_log);
	assert_int_equal(settings_apply_flag(&settings[S_ACCESS_LOG], "-", &c, why, sizeof(why)), 0);
	assert_string_equal(c.access_log, "-");
	assert_int_equal(settings_apply_flag(&settings[S_CHECK_DATA], NULL, &c, why, sizeof(why)), 0);
	assert_true(c.check_data);
	config_free(&c);
}

/* Every flag row is in --help once, with its default; no flag or YAML path
 * is given to two rows. */
static void test_help_lists_every_flag(void **state)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	(void)state;
	assert_non_null(f);
	settings_usage(f);
	fclose(f);
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		char want[160];
		for (size_t j = 0; j < i; j++) {
			if (s->flag && settings[j].flag && strcmp(s->flag, settings[j].flag) == 0)
				fail_msg("--%s is two rows", s->flag);
			if (s->yaml && settings[j].yaml && strcmp(s->yaml, settings[j].yaml) == 0)
				fail_msg("%s is two rows", s->yaml);
			if (s->short_flag && s->short_flag == settings[j].short_flag)
				fail_msg("-%c is two rows", s->short_flag);
		}
		if (!s->flag)
			continue;
		assert_ptr_equal(settings_by_flag(s->flag), s);
		snprintf(want, sizeof(want), "--%s%s%s ", s->flag, s->metavar ? " " : "", s->metavar ? s->metavar : "");
		const char *at = strstr(text, want);
		if (!at)
			fail_msg("--help lacks '%s'", want);
		const char *eol = strchr(at, '\n');
		if (s->def) {
			snprintf(want, sizeof(want), "(default %s)", s->def);
			const char *d = strstr(at, want);
			if (!d || d > eol)
				fail_msg("--help: --%s does not say %s", s->flag, want);
		}
	}
	free(text);
}

/* A reload warns once for each start-up-only setting it changes, and for
 * the listener set; nothing for live settings. */
static void test_warn_fixed(void **state)
{
	struct config a, b;
	(void)state;
	config_defaults(&a);
	config_defaults(&b);
	assert_int_equal(settings_warn_fixed(&a, &b), 0);
	b.max_body_size = 1;
	b.header_timeout_ms = 1;
	b.log_level = LOG_DEBUG;
	assert_int_equal(settings_warn_fixed(&a, &b), 0);
	b.slo_ttft_ms = 1;
	b.data_dir = NULL;
	b.admin_token_file = "token";
	assert_int_equal(settings_warn_fixed(&a, &b), 3);
	config_defaults(&b);
	b.listen = "127.0.0.1:8081";
	assert_int_equal(settings_warn_fixed(&a, &b), 1);
	unsigned restart = 0;
	for (size_t i = 0; i < S__COUNT; i++)
		restart += settings[i].reload == SR_RESTART;
	assert_int_equal(restart, 37); /* the keys docs/config.md lists, listen and listeners aside */
}

/* A file that writes every YAML row's default as the table does loads, and
 * gives the values the server starts with: each row is reachable from the
 * file and its default reads the same there. */
static void test_file_reads_every_default(void **state)
{
	char path[] = "/tmp/test_settings_XXXXXX";
	int fd = mkstemp(path);
	FILE *f;
	(void)state;
	assert_true(fd != -1);
	f = fdopen(fd, "w");
	assert_non_null(f);
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		const char *dot = s->yaml ? strchr(s->yaml, '.') : NULL;
		bool first = true;
		if (!s->yaml || !s->def)
			continue;
		if (!dot) {
			fprintf(f, "%s: \"%s\"\n", s->yaml, s->def);
			continue;
		}
		size_t plen = (size_t)(dot - s->yaml) + 1; /* "store." */
		for (size_t j = 0; j < i && first; j++)
			first = !(settings[j].yaml && settings[j].def && strncmp(settings[j].yaml, s->yaml, plen) == 0);
		if (!first)
			continue;
		fprintf(f, "%.*s:\n", (int)plen - 1, s->yaml);
		for (size_t j = i; j < S__COUNT; j++)
			if (settings[j].yaml && settings[j].def && strncmp(settings[j].yaml, s->yaml, plen) == 0)
				fprintf(f, "  %s: \"%s\"\n", settings[j].yaml + plen, settings[j].def);
	}
	fprintf(f, "upstreams: [{name: a, url: \"http://127.0.0.1:9\"}]\n");
	fclose(f);

	struct config want, got;
	char errs[4096] = "";
	config_defaults(&want);
	config_defaults(&got);
	got.slo_ttft_ms = 1; /* so that the file must set it back */
	unsigned problems = config_load_file(path, &got, errs, sizeof(errs));
	unlink(path);
	if (problems)
		fail_msg("%s", errs);
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		if (!s->yaml || !s->def)
			continue;
		const void *a = (const char *)&want + s->offset, *b = (const char *)&got + s->offset;
		switch (s->type) {
		case ST_STRING:
		case ST_STRING_OFF:
		case ST_ADMIN_LISTEN:
		case ST_LISTEN: assert_string_equal(*(const char *const *)a, *(const char *const *)b); break;
		case ST_LOGLEVEL: assert_int_equal(*(const int *)a, *(const int *)b); break;
		default:
			if (numeric(s, &want) != numeric(s, &got))
				fail_msg("%s: the file's %s does not read as the default", s->name, s->yaml);
		}
	}
	config_free(&got);
}

static char *read_doc(const char *rel)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", TOKENTAP_SOURCE_DIR, rel);
	FILE *f = fopen(path, "rb");
	if (!f)
		fail_msg("cannot open %s", path);
	char *text = calloc(1, 1 << 20);
	assert_non_null(text);
	size_t n = fread(text, 1, (1 << 20) - 1, f);
	fclose(f);
	text[n] = '\0';
	return text;
}

/* docs/config.md agrees with the table: each YAML row with a default has a
 * table line "| `KEY` | `DEFAULT` |" (KEY as its section's table names it,
 * the last part of the path), and the Signals section's start-up-only list
 * names every RESTART row. On a mismatch the line to paste is printed. */
static void test_doc_matches_table(void **state)
{
	char *doc = read_doc("docs/config.md");
	(void)state;
	const char *fixed = strstr(doc, "Read at start-up only, so that a reload");
	assert_non_null(fixed);
	const char *fixed_end = strstr(fixed, "Everything else takes effect");
	assert_non_null(fixed_end);
	for (size_t i = 0; i < S__COUNT; i++) {
		const struct setting *s = &settings[i];
		char want[200];
		if (!s->yaml)
			continue;
		const char *leaf = strrchr(s->yaml, '.');
		leaf = leaf ? leaf + 1 : s->yaml;
		if (s->def) {
			snprintf(want, sizeof(want), "| `%s` | `%s` |", leaf, s->def);
			if (!strstr(doc, want))
				fail_msg("docs/config.md: no line for %s with its default; expected: %s meaning |",
					 s->yaml, want);
		}
		if (s->reload == SR_RESTART) {
			snprintf(want, sizeof(want), "`%s`", s->yaml);
			const char *at = strstr(fixed, want);
			if (!at || at > fixed_end)
				fail_msg("docs/config.md, Signals: %s is read at start-up only but not listed", want);
		}
	}
	free(doc);
}

static char *generated_table(void)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	assert_non_null(f);
	settings_doc_table(f);
	fclose(f);
	return text;
}

/* docs/config.md's settings reference is exactly what settings_doc_table
 * makes from the table: every key, flag, type, default, range, reload rule
 * and help line. On a mismatch the first line that differs is shown;
 * `test_settings --write-doc` rewrites the block in place. */
static void test_doc_reference_is_generated(void **state)
{
	char *doc = read_doc("docs/config.md"), *want = generated_table();
	(void)state;
	const char *begin = strstr(doc, SETTINGS_DOC_BEGIN);
	if (!begin)
		fail_msg(
			"docs/config.md has no settings reference (%s); run test_settings --write-doc after adding "
			"the two marker lines",
			SETTINGS_DOC_BEGIN);
	const char *end = strstr(begin, SETTINGS_DOC_END);
	assert_non_null(end);
	end += strlen(SETTINGS_DOC_END);
	size_t have = (size_t)(end - begin);
	if (have != strlen(want) || memcmp(begin, want, have) != 0) {
		const char *a = begin, *b = want;
		while (*a == *b && a < end) { /* to the first difference, then back to its line */
			a++;
			b++;
		}
		while (a > begin && a[-1] != '\n') {
			a--;
			b--;
		}
		fail_msg(
			"docs/config.md's settings reference differs from SETTINGS(X) (run "
			"build/tests/unit/test_settings --write-doc)\n  doc:   %.*s\n  table: %.*s",
			(int)strcspn(a, "\n"), a, (int)strcspn(b, "\n"), b);
	}
	free(want);
	free(doc);
}

/* The Signals section's two lists say the table's reload rules: every key
 * the start-up-only list names is a RESTART row (or the listener set), and
 * every key the live list names is a LIVE row or a section of them. */
static void test_doc_signals_match_reload(void **state)
{
	char *doc = read_doc("docs/config.md");
	(void)state;
	const char *fixed = strstr(doc, "Read at start-up only, so that a reload");
	assert_non_null(fixed);
	const char *live = strstr(fixed, "Everything else takes effect");
	assert_non_null(live);
	const char *live_end = strstr(live, "- **SIGTERM**");
	assert_non_null(live_end);
	for (const char *p = fixed; (p = strchr(p, '`')) && p < live_end; p++) {
		const char *q = strchr(p + 1, '`');
		char key[80];
		assert_non_null(q);
		snprintf(key, sizeof(key), "%.*s", (int)(q - p - 1), p + 1);
		p = q;
		bool in_fixed = q < live;
		const struct setting *s = settings_by_yaml(key);
		if (in_fixed) {
			if (strcmp(key, "listeners") == 0)
				continue;
			if (!s || (s->reload != SR_RESTART && s->reload != SR_RESTART_LISTENER))
				fail_msg(
					"docs/config.md, Signals: `%s` is listed as start-up only, but the table says "
					"%s",
					key, s ? "it is live" : "no such key");
			continue;
		}
		/* the live list: a row, a leaf of the timeouts section, or a section */
		if (!s) {
			char path[96];
			snprintf(path, sizeof(path), "timeouts.%s", key);
			s = settings_by_yaml(path);
		}
		if (s && s->reload != SR_LIVE)
			fail_msg("docs/config.md, Signals: `%s` is listed as live, but a reload does not apply it",
				 key);
		if (!s && strcmp(key, "upstreams") && strcmp(key, "routes") && strcmp(key, "limits") &&
		    strcmp(key, "timeouts"))
			fail_msg("docs/config.md, Signals: `%s` in the live list is not a setting", key);
	}
	free(doc);
}

/* `test_settings --write-doc`: replaces docs/config.md's settings reference
 * with the one the table makes, and exits. */
static int write_doc(void)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/docs/config.md", TOKENTAP_SOURCE_DIR);
	char *doc = read_doc("docs/config.md"), *want = generated_table();
	char *begin = strstr(doc, SETTINGS_DOC_BEGIN), *end = begin ? strstr(begin, SETTINGS_DOC_END) : NULL;
	if (!end) {
		fprintf(stderr, "%s: no lines %s and %s to write between\n", path, SETTINGS_DOC_BEGIN,
			SETTINGS_DOC_END);
		return 1;
	}
	end += strlen(SETTINGS_DOC_END);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(doc, 1, (size_t)(begin - doc), f) != (size_t)(begin - doc) || fputs(want, f) == EOF ||
	    fputs(end, f) == EOF || fclose(f) != 0) {
		perror(path);
		return 1;
	}
	printf("%s: settings reference written\n", path);
	free(want);
	free(doc);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--write-doc") == 0)
		return write_doc();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_default_parses_in_range),
		cmocka_unit_test(test_defaults_are_todays),
		cmocka_unit_test(test_ranges_hold),
		cmocka_unit_test(test_durations_bounded),
		cmocka_unit_test(test_flag_side_effects),
		cmocka_unit_test(test_help_lists_every_flag),
		cmocka_unit_test(test_warn_fixed),
		cmocka_unit_test(test_file_reads_every_default),
		cmocka_unit_test(test_doc_matches_table),
		cmocka_unit_test(test_doc_reference_is_generated),
		cmocka_unit_test(test_doc_signals_match_reload),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
