/*
 * tenant.c — tenant names from header values, JSON fields and API keys.
 *
 * The hash is OpenSSL's (HMAC, SHA-256), through tt_base's link. The key's
 * bytes are read here and nowhere kept: out gets only the digest's hex.
 */
#include "tenant.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

int tenant_take(const char *s, size_t len, char *out)
{
	while (len && (s[0] == ' ' || s[0] == '\t'))
		s++, len--;
	while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	if (len == 0) {
		out[0] = '\0';
		return 0;
	}
	if (!tenant_name_ok(s, len)) {
		memcpy(out, TENANT_INVALID, sizeof(TENANT_INVALID));
		return -1;
	}
	memcpy(out, s, len);
	out[len] = '\0';
	return 1;
}

bool tenant_bearer(const char *s, size_t len, const char **tok, size_t *toklen)
{
	while (len && (s[0] == ' ' || s[0] == '\t'))
		s++, len--;
	if (len < 7 || strncasecmp(s, "bearer", 6) != 0 || (s[6] != ' ' && s[6] != '\t'))
		return false;
	s += 7, len -= 7;
	while (len && (s[0] == ' ' || s[0] == '\t'))
		s++, len--;
	while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	if (!len)
		return false;
	*tok = s;
	*toklen = len;
	return true;
}

static void hex(const unsigned char *d, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[d[i] >> 4];
		out[2 * i + 1] = digits[d[i] & 15];
	}
	out[2 * n] = '\0';
}

void tenant_key_sha256(const char *key, size_t len, char out[65])
{
	unsigned char d[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *)key, len, d);
	hex(d, sizeof(d), out);
	OPENSSL_cleanse(d, sizeof(d));
}

void tenant_key_label(const char *salt, size_t saltlen, const char *key, size_t len, char *out)
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned int dl = 0;
	size_t plen = sizeof(TENANT_KEY_PREFIX) - 1;

	memcpy(out, TENANT_KEY_PREFIX, plen);
	if (!HMAC(EVP_sha256(), salt, (int)saltlen, (const unsigned char *)key, len, d, &dl) ||
	    dl < TENANT_KEY_HEX / 2) {
		memcpy(out, TENANT_INVALID, sizeof(TENANT_INVALID));
		return;
	}
	hex(d, TENANT_KEY_HEX / 2, out + plen);
	OPENSSL_cleanse(d, sizeof(d));
}
