/*
 * test_variant.c — variant specs without running attention: validation of
 * bad specs (each with its message), the copy (the caller's strings may
 * change after create), the built-ins, the generated hook text for C and
 * CUDA (declarations, parameter struct, identity hooks, #line numbering),
 * and the examples of variant_examples.c. Needs no compiler.
 */
#include "util.h"
#include "variant_examples.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *source_of(const fi_variant *v, fi_variant_target t) {
    size_t n = fi_variant_source(v, t, NULL, 0);
    char *s = malloc(n + 1);
    if (s && fi_variant_source(v, t, s, n + 1) != n) s[0] = 0;
    return s;
}

static int contains(const char *hay, const char *needle, const char *what) {
    if (hay && strstr(hay, needle)) return 0;
    tu_note("%s: generated text lacks \"%s\"", what, needle);
    return 1;
}

static const fi_variant_param one_f32[] = {{"a", FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};

/* One bad spec: a field changed from a good one, the status and message. */
static int bad_spec(const char *what, void (*edit)(fi_variant_spec *), const char *needle) {
    fi_variant_spec s;
    fi_variant_spec_init(&s);
    s.name = "ok_name";
    s.params = one_f32, s.num_params = 1;
    edit(&s);
    fi_variant *v = (fi_variant *)1;
    int fail = tu_expect_status(fi_variant_create(&s, &v), FI_STATUS_INVALID_ARGUMENT, needle, what);
    if (v != NULL) {
        tu_note("%s: out not reset to NULL", what);
        fail = 1;
    }
    return fail;
}

static void e_size(fi_variant_spec *s) { s->struct_size = 4; }
static void e_name_null(fi_variant_spec *s) { s->name = NULL; }
static void e_name_digit(fi_variant_spec *s) { s->name = "9lives"; }
static void e_name_space(fi_variant_spec *s) { s->name = "my variant"; }
static void e_name_long(fi_variant_spec *s) {
    s->name = "a234567890123456789012345678901234567890123456789012345678901234567890";
}
static void e_nparams_neg(fi_variant_spec *s) { s->num_params = -1; }
static void e_nparams_big(fi_variant_spec *s) { s->num_params = FI_VARIANT_MAX_PARAMS + 1; }
static void e_params_null(fi_variant_spec *s) { s->params = NULL; }
static void e_softmax(fi_variant_spec *s) { s->use_softmax = 2; }
static const fi_variant_param p_kw[] = {{"float", FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};
static void e_param_keyword(fi_variant_spec *s) { s->params = p_kw; }
static const fi_variant_param p_pre[] = {{"fi_x", FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};
static void e_param_prefix(fi_variant_spec *s) { s->params = p_pre; }
static const fi_variant_param p_dup[] = {{"a", FI_VARIANT_PARAM_F32, FI_DTYPE_F32},
                                         {"a", FI_VARIANT_PARAM_I32, FI_DTYPE_I32}};
static void e_param_dup(fi_variant_spec *s) { s->params = p_dup, s->num_params = 2; }
static const fi_variant_param p_kind[] = {{"a", (fi_variant_param_kind)7, FI_DTYPE_F32}};
static void e_param_kind(fi_variant_spec *s) { s->params = p_kind; }
static const fi_variant_param p_dtype[] = {{"a", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_E4M3}};
static void e_param_dtype(fi_variant_spec *s) { s->params = p_dtype; }
static const fi_variant_param p_noname[] = {{NULL, FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};
static void e_param_noname(fi_variant_spec *s) { s->params = p_noname; }
static void e_snippet_long(fi_variant_spec *s) {
    static char big[70 * 1024];
    memset(big, ' ', sizeof big - 1);
    s->logits_transform = big;
}

static void validation(void) {
    struct {
        const char *what;
        void (*edit)(fi_variant_spec *);
        const char *needle;
    } cases[] = {
        {"struct_size", e_size, "fi_variant_spec_init"},
        {"name NULL", e_name_null, "not a C identifier"},
        {"name digit", e_name_digit, "\"9lives\" is not a C identifier"},
        {"name space", e_name_space, "not a C identifier"},
        {"name long", e_name_long, "at most 64"},
        {"num_params -1", e_nparams_neg, "num_params=-1"},
        {"num_params 17", e_nparams_big, "expected 0 to 16"},
        {"params NULL", e_params_null, "params is NULL"},
        {"use_softmax 2", e_softmax, "use_softmax=2"},
        {"param keyword", e_param_keyword, "keyword"},
        {"param prefix", e_param_prefix, "reserved prefix"},
        {"param duplicate", e_param_dup, "both named \"a\""},
        {"param kind", e_param_kind, "kind=7"},
        {"param dtype", e_param_dtype, "dtype e4m3"},
        {"param no name", e_param_noname, "(null)"},
        {"snippet too long", e_snippet_long, "longer than"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "validation/%s", cases[i].what);
        if (!tu_selected(name)) continue;
        tu_record("validation", name,
                  bad_spec(cases[i].what, cases[i].edit, cases[i].needle) ? TU_FAIL : TU_PASS);
    }
    if (tu_selected("validation/null")) {
        int fail = 0;
        fi_variant *v;
        fail |= tu_expect_status(fi_variant_create(NULL, &v), FI_STATUS_INVALID_ARGUMENT,
                                 "spec is NULL", "NULL spec");
        fail |= tu_expect_status(fi_variant_create(vx_spec(0), NULL), FI_STATUS_INVALID_ARGUMENT,
                                 "out is NULL", "NULL out");
        fi_variant_destroy(NULL);
        fail |= fi_variant_source(NULL, FI_VARIANT_TARGET_C, NULL, 0) != 0;
        fail |= fi_variant_get_spec(NULL) != NULL;
        tu_record("validation", "validation/null", fail ? TU_FAIL : TU_PASS);
    }
}

/* The caller's strings may be freed or changed after create. */
static void copy(void) {
    if (!tu_selected("copy/strings")) return;
    char name[16] = "mine", pname[8] = "gain", body[64] = "return s * p.gain;";
    fi_variant_param prm = {pname, FI_VARIANT_PARAM_F32, FI_DTYPE_F32};
    fi_variant_spec s;
    fi_variant_spec_init(&s);
    s.name = name, s.params = &prm, s.num_params = 1, s.logits_transform = body;
    fi_variant *v = NULL;
    int fail = tu_expect_status(fi_variant_create(&s, &v), FI_OK, NULL, "create");
    strcpy(name, "XXXX"), strcpy(pname, "YYYY"), strcpy(body, "garbage");
    prm.kind = FI_VARIANT_PARAM_TENSOR;
    const fi_variant_spec *got = fi_variant_get_spec(v);
    if (!fail) {
        fail |= strcmp(got->name, "mine") != 0 || strcmp(got->params[0].name, "gain") != 0 ||
                got->params[0].kind != FI_VARIANT_PARAM_F32 ||
                strcmp(got->logits_transform, "return s * p.gain;") != 0 ||
                got->query_transform != NULL || got->use_softmax != 1;
        char *src = source_of(v, FI_VARIANT_TARGET_C);
        fail |= contains(src, "float gain;", "copy");
        fail |= contains(src, "return s * p.gain;", "copy");
        free(src);
    }
    fi_variant_destroy(v);
    tu_record("copy", "copy/strings", fail ? TU_FAIL : TU_PASS);
}

static void builtins(void) {
    const char *names[] = {"none", "soft_cap", "alibi", "sliding_window", "custom_mask",
                           "rope_llama"};
    const char *needles[] = {"FI_VARIANT_HAS_LOGITS_TRANSFORM 0", "p.cap * tanhf(s / p.cap)",
                             "p.slopes[c->qo_head]", "c->q_pos - p.window_left",
                             "p.mask_indptr[c->request]", "fi_rope_row(x, c->head_dim, c->kv_pos"};
    for (int i = 0; i < 6; i++) {
        char name[64];
        snprintf(name, sizeof name, "builtin/%s", names[i]);
        if (!tu_selected(name)) continue;
        const fi_variant *v = NULL, *again = NULL;
        int fail = tu_expect_status(fi_variant_builtin(names[i], &v), FI_OK, NULL, names[i]);
        fail |= fi_variant_builtin(names[i], &again) != FI_OK || again != v;
        if (!fail) {
            char *src = source_of(v, FI_VARIANT_TARGET_C);
            fail |= contains(src, needles[i], names[i]);
            free(src);
            fi_variant_destroy((fi_variant *)v); /* a no-op for built-ins */
            fail |= strcmp(fi_variant_get_spec(v)->name, names[i]) != 0;
        }
        tu_record("builtin", name, fail ? TU_FAIL : TU_PASS);
    }
    if (tu_selected("builtin/unknown")) {
        const fi_variant *v = (const fi_variant *)1;
        int fail = tu_expect_status(fi_variant_builtin("softcap", &v), FI_STATUS_INVALID_ARGUMENT,
                                    "no built-in variant \"softcap\"", "unknown");
        fail |= v != NULL;
        tu_record("builtin", "builtin/unknown", fail ? TU_FAIL : TU_PASS);
    }
}

/* Generated text: declarations for both targets, identity hooks, layout. */
static void text(void) {
    for (int i = 0; i < VX_COUNT; i++) {
        const fi_variant_spec *s = vx_spec(i);
        char name[64];
        snprintf(name, sizeof name, "text/%s", s->name);
        if (!tu_selected(name)) continue;
        fi_variant *v = NULL;
        int fail = tu_expect_status(fi_variant_create(s, &v), FI_OK, NULL, s->name);
        char *c = fail ? NULL : source_of(v, FI_VARIANT_TARGET_C);
        char *cu = fail ? NULL : source_of(v, FI_VARIANT_TARGET_CUDA);
        static const char *const both[] = {
            "typedef struct fi_hook_ctx", "} fi_variant_params;",
            "FI_HOOK void fi_query_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *",
            "FI_HOOK void fi_key_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *",
            "FI_HOOK void fi_value_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *",
            "FI_HOOK float fi_logits_transform(float s, const fi_hook_ctx *c, const fi_variant_params *",
            "FI_HOOK int fi_logits_mask(const fi_hook_ctx *c, const fi_variant_params *",
            "FI_HOOK void fi_output_transform(float *o, float lse, const fi_hook_ctx *c,",
            "FI_HOOK float fi_f16(uint16_t h)", "FI_HOOK float fi_bf16(uint16_t h)",
            "const fi_variant_params p = *fi_p;",
        };
        for (size_t k = 0; k < sizeof both / sizeof both[0]; k++) {
            fail |= contains(c, both[k], "C");
            fail |= contains(cu, both[k], "CUDA");
        }
        fail |= contains(c, "#define FI_HOOK static inline", "C");
        fail |= contains(c, "#include <math.h>", "C");
        fail |= contains(cu, "#define FI_HOOK __device__ __forceinline__", "CUDA");
        if (cu && strstr(cu, "#include")) {
            tu_note("CUDA text includes a header");
            fail = 1;
        }
        char want[96];
        snprintf(want, sizeof want, "#define FI_VARIANT_USE_SOFTMAX %d", (int)s->use_softmax);
        fail |= contains(c, want, "C");
        snprintf(want, sizeof want, "#define FI_VARIANT_HAS_LOGITS_MASK %d", s->logits_mask != NULL);
        fail |= contains(c, want, "C");
        if (s->logits_mask) {
            snprintf(want, sizeof want, "#line 1 \"%s.logits_mask\"", s->name);
            fail |= contains(c, want, "C");
        } else {
            fail |= contains(c, "    return 1;\n", "C identity mask");
        }
        if (!s->logits_transform) fail |= contains(c, "    return s;\n", "C identity logits");
        for (int32_t k = 0; k < s->num_params; k++) {
            snprintf(want, sizeof want, "%s;\n", s->params[k].name);
            fail |= contains(c, want, "C member");
        }
        /* the snippet text and the buffer contract (truncated, NUL-terminated) */
        char small[16];
        size_t n = fi_variant_source(v, FI_VARIANT_TARGET_C, small, sizeof small);
        fail |= n != (c ? strlen(c) : 0) || strlen(small) != sizeof small - 1;
        free(c);
        free(cu);
        fi_variant_destroy(v);
        tu_record("text", name, fail ? TU_FAIL : TU_PASS);
    }
    /* the parameter struct's layout: pointers after a 4-byte scalar are padded */
    if (tu_selected("text/layout")) {
        static const fi_variant_param prm[] = {{"a", FI_VARIANT_PARAM_I32, FI_DTYPE_I32},
                                               {"t", FI_VARIANT_PARAM_TENSOR, FI_DTYPE_F16},
                                               {"b", FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};
        fi_variant_spec s;
        fi_variant_spec_init(&s);
        s.name = "layout", s.params = prm, s.num_params = 3;
        fi_variant *v = NULL;
        int fail = fi_variant_create(&s, &v) != FI_OK;
        char *c = fail ? NULL : source_of(v, FI_VARIANT_TARGET_C);
        char want[96];
        snprintf(want, sizeof want, "sizeof(fi_variant_params) == %d", (int)(3 * sizeof(void *)));
        fail |= contains(c, "    int32_t a;\n    const uint16_t *t;\n    float b;\n", "layout");
        fail |= contains(c, want, "layout");
        free(c);
        fi_variant_destroy(v);
        tu_record("text", "text/layout", fail ? TU_FAIL : TU_PASS);
    }
}

int main(int argc, char **argv) {
    if (tu_parse_args(argc, argv, "variant specs: validation, copies, built-ins, hook text"))
        return 2;
    validation();
    copy();
    builtins();
    text();
    return tu_summary("test_variant");
}
