/* tpl_number.c - Python's numbers as text: repr() of a float (the shortest string that reads
 * back), float() and int(s, base) of a string, and round() of a float. Pure functions of their
 * arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl.h"

/* ---------------------------------------------------------------------------------------- */
/* repr(float): shortest round-trip digits, Python's layout                                 */

void tpl_fmt_float(double x, char out[40]) {
    if (isnan(x)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-inf" : "inf");
        return;
    }
    if (x == 0) {
        strcpy(out, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int k = 0; k < -decpt; k++) *o++ = '0';
            memcpy(o, digits, (size_t)nd);
            o += nd;
        } else if (decpt >= nd) {
            memcpy(o, digits, (size_t)nd);
            o += nd;
            for (int k = nd; k < decpt; k++) *o++ = '0';
            *o++ = '.';
            *o++ = '0';
        } else {
            memcpy(o, digits, (size_t)decpt);
            o += decpt;
            *o++ = '.';
            memcpy(o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(nd - 1));
            o += nd - 1;
        }
        int e = decpt - 1;
        sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Python float()/int() parsing of strings                                                   */

bool tpl_parse_py_float(const tstr *s, double *out) {
    const char *p = s->s, *e = s->s + s->len;
    while (p < e && ((unsigned char)*p <= ' ') && tpl_is_space((unsigned char)*p)) p++;
    while (e > p && tpl_is_space((unsigned char)e[-1])) e--;
    if (p == e) return false;
    char buf[128];
    size_t o = 0;
    for (const char *q = p; q < e; q++) {
        if (*q == '_') {
            if (q == p || q + 1 == e || !(q[-1] >= '0' && q[-1] <= '9') ||
                !(q[1] >= '0' && q[1] <= '9'))
                return false;
            continue;
        }
        if (o + 1 >= sizeof buf) return false;
        buf[o++] = *q;
    }
    buf[o] = 0;
    const char *b = buf;
    if (*b == '+' || *b == '-') b++;
    if (!strcasecmp(b, "inf") || !strcasecmp(b, "infinity") || !strcasecmp(b, "nan")) {
        double v = (b[0] | 32) == 'n' ? NAN : INFINITY;
        *out = buf[0] == '-' ? -v : v;
        return true;
    }
    for (const char *q = b; *q; q++)
        if (!strchr("0123456789.eE+-", *q)) return false;
    char *end;
    *out = strtod(buf, &end);
    return *end == 0 && end != buf;
}

bool tpl_parse_py_int(const tstr *s, int base, int64_t *out, bool *overflow) {
    const char *p = s->s, *e = s->s + s->len;
    *overflow = false;
    while (p < e && tpl_is_space((unsigned char)*p)) p++;
    while (e > p && tpl_is_space((unsigned char)e[-1])) e--;
    bool neg = false;
    if (p < e && (*p == '+' || *p == '-')) neg = *p++ == '-';
    if (p == e) return false;
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (e - p >= 2 && p[0] == '0') {
            char x = (char)(p[1] | 32);
            int b = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
            if (b && (base == 0 || base == b)) {
                base = b;
                p += 2;
                if (p < e && *p == '_') p++;
            }
        }
        if (base == 0) base = 10;
    }
    if (base < 2 || base > 36 || p == e) return false;
    uint64_t v = 0;
    bool prev_us = true;
    for (; p < e; p++) {
        if (*p == '_') {
            if (prev_us) return false;
            prev_us = true;
            continue;
        }
        int d;
        char ch = *p;
        if (ch >= '0' && ch <= '9')
            d = ch - '0';
        else if ((ch | 32) >= 'a' && (ch | 32) <= 'z')
            d = (ch | 32) - 'a' + 10;
        else
            return false;
        if (d >= base) return false;
        prev_us = false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) {
            *overflow = true;
            return true;
        }
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (prev_us) return false;
    if (v > (uint64_t)INT64_MAX + (neg ? 1 : 0)) {
        *overflow = true;
        return true;
    }
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* Python round(x, ndigits) for floats: correctly rounded through the decimal expansion. */
double tpl_py_round(double x, int64_t nd) {
    if (!isfinite(x) || x == 0) return x;
    if (nd > 320) return x;
    if (nd >= 0) {
        char buf[512];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        return strtod(buf, NULL);
    }
    if (nd < -320) return copysign(0.0, x);
    double p = pow(10.0, (double)-nd);
    double y = x / p, z = round(y);
    if (fabs(y - z) == 0.5) z = 2.0 * round(y / 2.0);
    z *= p;
    if (!isfinite(z)) return x;
    return z;
}
