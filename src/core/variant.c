/*
 * variant.c — user-defined variants: validation and copy of a spec, the
 * parameter struct's layout, run-time argument checks and packing, and the
 * ONE generator of hook text (fi_variant_source) both backends splice into
 * their kernels. The built-in specs are in variant_builtin.c.
 */
#include "core/variant.h"
#include "core/cache.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)
#define MAX_NAME 64
#define MAX_SNIPPET (64 * 1024)

static const char *const hook_names[FI_HOOK_COUNT] = {
    "query_transform", "key_transform", "value_transform",
    "logits_transform", "logits_mask", "output_transform",
};

void fi_variant_spec_init(fi_variant_spec *spec) {
    if (!spec) return;
    memset(spec, 0, sizeof *spec);
    spec->struct_size = sizeof *spec;
    spec->use_softmax = 1;
}

const char *fi_variant_hook(const fi_variant *v, fi_hook_id id) {
    const fi_variant_spec *s = &v->spec;
    const char *h[FI_HOOK_COUNT] = {s->query_transform, s->key_transform, s->value_transform,
                                    s->logits_transform, s->logits_mask, s->output_transform};
    return id < FI_HOOK_COUNT ? h[id] : NULL;
}

const fi_variant_spec *fi_variant_get_spec(const fi_variant *v) {
    return v && fi_variant_check(v, "fi_variant_get_spec") == FI_OK ? &v->spec : NULL;
}

fi_status fi_variant_check(const fi_variant *v, const char *fn) {
    return fi_handle_check(v, FI_MAGIC_VARIANT, fn, "variant");
}

void fi_variant_retain(const fi_variant *v) {
    if (v && !v->builtin) atomic_fetch_add(&((fi_variant *)v)->refs, 1);
}

void fi_variant_release(const fi_variant *v) {
    if (!v || v->builtin) return;
    fi_variant *w = (fi_variant *)v;
    if (atomic_fetch_sub(&w->refs, 1) != 1) return;
    fi_handle_retire(&w->magic);
    free(w->text);
    free(w);
}

/* ------------------------------------------------------------ validation */

static bool is_identifier(const char *s) {
    if (!s || !s[0] || strlen(s) > MAX_NAME) return false;
    for (const char *c = s; *c; c++) {
        bool alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
        bool digit = *c >= '0' && *c <= '9';
        if (!alpha && !(digit && c != s)) return false;
    }
    return true;
}

/* Words a struct member may not be named in C or CUDA C++. */
static bool is_reserved(const char *s) {
    static const char *const words[] = {
        "auto", "bool", "break", "case", "char", "class", "const", "continue", "default",
        "delete", "do", "double", "else", "enum", "extern", "false", "float", "for", "goto",
        "if", "inline", "int", "long", "namespace", "new", "operator", "private", "protected",
        "public", "register", "restrict", "return", "short", "signed", "sizeof", "static",
        "struct", "switch", "template", "this", "true", "typedef", "typename", "union",
        "unsigned", "using", "virtual", "void", "volatile", "while",
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcmp(s, words[i]) == 0) return true;
    return strncmp(s, "fi_", 3) == 0 || strncmp(s, "FI_", 3) == 0 || strncmp(s, "__", 2) == 0;
}

static bool is_tensor_dtype(fi_dtype t) {
    return t == FI_DTYPE_F32 || t == FI_DTYPE_F16 || t == FI_DTYPE_BF16 || t == FI_DTYPE_I32 ||
           t == FI_DTYPE_U8;
}

static fi_status check_param(const fi_variant_spec *s, int32_t i) {
    const fi_variant_param *p = &s->params[i];
    if (!is_identifier(p->name))
        return INVALID("variant %s: params[%d].name \"%.40s\" is not a C identifier of at most "
                       "%d characters", s->name, (int)i, p->name ? p->name : "(null)", MAX_NAME);
    if (is_reserved(p->name))
        return INVALID("variant %s: params[%d].name \"%s\" is a C/C++ keyword or uses a "
                       "reserved prefix (fi_, FI_, __)", s->name, (int)i, p->name);
    for (int32_t k = 0; k < i; k++)
        if (strcmp(s->params[k].name, p->name) == 0)
            return INVALID("variant %s: params[%d] and params[%d] are both named \"%s\"",
                           s->name, (int)k, (int)i, p->name);
    if (p->kind != FI_VARIANT_PARAM_F32 && p->kind != FI_VARIANT_PARAM_I32 &&
        p->kind != FI_VARIANT_PARAM_TENSOR)
        return INVALID("variant %s: params[%d] (%s).kind=%d is not a fi_variant_param_kind",
                       s->name, (int)i, p->name, (int)p->kind);
    if (p->kind == FI_VARIANT_PARAM_TENSOR && !is_tensor_dtype(p->dtype))
        return INVALID("variant %s: tensor parameter %s has dtype %s: expected f32, f16, "
                       "bf16, i32 or u8", s->name, p->name, fi_dtype_name(p->dtype));
    return FI_OK;
}

static fi_status check_spec(const fi_variant_spec *s) {
    if (s->struct_size != sizeof *s)
        return INVALID("fi_variant_spec.struct_size=%u, expected %zu: call "
                       "fi_variant_spec_init first", (unsigned)s->struct_size, sizeof *s);
    if (!is_identifier(s->name))
        return INVALID("variant name \"%.40s\" is not a C identifier of at most %d characters",
                       s->name ? s->name : "(null)", MAX_NAME);
    if (s->num_params < 0 || s->num_params > FI_VARIANT_MAX_PARAMS)
        return INVALID("variant %s: num_params=%d, expected 0 to %d", s->name,
                       (int)s->num_params, FI_VARIANT_MAX_PARAMS);
    if (s->num_params > 0 && !s->params)
        return INVALID("variant %s: num_params=%d but params is NULL", s->name,
                       (int)s->num_params);
    if (s->use_softmax != 0 && s->use_softmax != 1)
        return INVALID("variant %s: use_softmax=%d, expected 0 or 1", s->name,
                       (int)s->use_softmax);
    fi_status st;
    for (int32_t i = 0; i < s->num_params; i++)
        if ((st = check_param(s, i))) return st;
    const char *text[FI_HOOK_COUNT + 1] = {s->query_transform, s->key_transform,
                                           s->value_transform, s->logits_transform,
                                           s->logits_mask, s->output_transform, s->helpers};
    for (int i = 0; i <= FI_HOOK_COUNT; i++)
        if (text[i] && strlen(text[i]) > MAX_SNIPPET)
            return INVALID("variant %s: %s is longer than %d bytes", s->name,
                           i < FI_HOOK_COUNT ? hook_names[i] : "helpers", MAX_SNIPPET);
    return FI_OK;
}

/* ------------------------------------------------------------------ copy */

static size_t str_bytes(const char *s) { return s ? strlen(s) + 1 : 0; }

static const char *put_str(char **cursor, const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    memcpy(*cursor, s, n);
    const char *out = *cursor;
    *cursor += n;
    return out;
}

/* Natural alignment of each member, in spec order. */
static void layout(fi_variant *v) {
    int32_t at = 0, align = 1;
    for (int32_t i = 0; i < v->spec.num_params; i++) {
        int32_t size = v->params[i].kind == FI_VARIANT_PARAM_TENSOR ? (int32_t)sizeof(void *) : 4;
        at = (at + size - 1) / size * size;
        v->offset[i] = at;
        at += size;
        if (size > align) align = size;
    }
    if (at == 0) at = 1; /* an empty struct holds one char */
    v->params_size = (at + align - 1) / align * align;
}

/* Copy a checked spec into v (text: one allocation for every string). */
static fi_status copy_spec(fi_variant *v, const fi_variant_spec *s) {
    const char *text[] = {s->name, s->query_transform, s->key_transform, s->value_transform,
                          s->logits_transform, s->logits_mask, s->output_transform, s->helpers};
    size_t bytes = 0;
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++) bytes += str_bytes(text[i]);
    for (int32_t i = 0; i < s->num_params; i++) bytes += str_bytes(s->params[i].name);
    char *mem = malloc(bytes ? bytes : 1), *c = mem;
    if (!mem) return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant %s: out of memory", s->name);
    v->text = mem;
    v->spec = *s;
    v->spec.name = put_str(&c, s->name);
    v->spec.query_transform = put_str(&c, s->query_transform);
    v->spec.key_transform = put_str(&c, s->key_transform);
    v->spec.value_transform = put_str(&c, s->value_transform);
    v->spec.logits_transform = put_str(&c, s->logits_transform);
    v->spec.logits_mask = put_str(&c, s->logits_mask);
    v->spec.output_transform = put_str(&c, s->output_transform);
    v->spec.helpers = put_str(&c, s->helpers);
    for (int32_t i = 0; i < s->num_params; i++) {
        v->params[i] = s->params[i];
        v->params[i].name = put_str(&c, s->params[i].name);
        if (v->params[i].kind != FI_VARIANT_PARAM_TENSOR)
            v->params[i].dtype = v->params[i].kind == FI_VARIANT_PARAM_F32 ? FI_DTYPE_F32
                                                                            : FI_DTYPE_I32;
    }
    v->spec.params = s->num_params ? v->params : NULL;
    layout(v);
    char *src = fi_variant_source_alloc(v, FI_VARIANT_TARGET_C);
    if (!src) {
        free(mem);
        v->text = NULL;
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant %s: out of memory", s->name);
    }
    v->hash = fi_fnv_str(FI_FNV_SEED, src);
    free(src);
    return FI_OK;
}

fi_status fi_variant_init_static(fi_variant *v, const fi_variant_spec *spec) {
    memset(v, 0, sizeof *v);
    fi_status st = check_spec(spec);
    if (!st) st = copy_spec(v, spec);
    v->builtin = true;
    v->magic = FI_MAGIC_VARIANT;
    return st;
}

fi_status fi_variant_create(const fi_variant_spec *spec, fi_variant **out) {
    if (!out) return INVALID("fi_variant_create: out is NULL");
    *out = NULL;
    if (!spec) return INVALID("fi_variant_create: spec is NULL");
    fi_status st = check_spec(spec);
    if (st) return st;
    fi_variant *v = calloc(1, sizeof *v);
    if (!v) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_variant_create: out of memory");
    if ((st = copy_spec(v, spec))) {
        free(v);
        return st;
    }
    v->magic = FI_MAGIC_VARIANT;
    atomic_init(&v->refs, 1);
    *out = v;
    return FI_OK;
}

/* The user's reference: freed now, or when the last plan made with it is
 * destroyed. A destroyed or foreign pointer is ignored (best effort). */
void fi_variant_destroy(fi_variant *v) {
    if (!v || fi_variant_check(v, "fi_variant_destroy") || v->builtin) return;
    fi_variant_release(v);
}

/* ------------------------------------------------------------- run args */

static const char *kind_name(fi_variant_param_kind k) {
    return k == FI_VARIANT_PARAM_F32 ? "f32" : k == FI_VARIANT_PARAM_I32 ? "i32" : "tensor";
}

fi_status fi_variant_check_args(const fi_variant *v, const fi_variant_args *a) {
    int32_t n = v->spec.num_params;
    if (!a) {
        if (n == 0) return FI_OK;
        return INVALID("variant %s takes %d parameters: variant_args is NULL", v->spec.name,
                       (int)n);
    }
    if (a->num_values != n)
        return INVALID("variant %s takes %d parameters, variant_args has %d", v->spec.name,
                       (int)n, (int)a->num_values);
    if (n > 0 && !a->values)
        return INVALID("variant %s: variant_args.values is NULL", v->spec.name);
    for (int32_t i = 0; i < n; i++) {
        const fi_variant_param *p = &v->params[i];
        const fi_variant_value *x = &a->values[i];
        if (x->kind != p->kind)
            return INVALID("variant %s: values[%d] (%s) is a %s, the spec declares a %s",
                           v->spec.name, (int)i, p->name,
                           x->kind >= FI_VARIANT_PARAM_F32 && x->kind <= FI_VARIANT_PARAM_TENSOR
                               ? kind_name(x->kind)
                               : "value of unknown kind",
                           kind_name(p->kind));
        if (p->kind == FI_VARIANT_PARAM_TENSOR && !x->ptr)
            return INVALID("variant %s: tensor parameter %s (values[%d]) is NULL", v->spec.name,
                           p->name, (int)i);
    }
    return FI_OK;
}

void fi_variant_pack(const fi_variant *v, const fi_variant_args *a, void *buf) {
    char *b = buf;
    memset(b, 0, (size_t)v->params_size);
    for (int32_t i = 0; i < v->spec.num_params; i++) {
        const fi_variant_value *x = &a->values[i];
        char *at = b + v->offset[i];
        switch (v->params[i].kind) {
        case FI_VARIANT_PARAM_F32: memcpy(at, &x->f32, 4); break;
        case FI_VARIANT_PARAM_I32: memcpy(at, &x->i32, 4); break;
        case FI_VARIANT_PARAM_TENSOR: memcpy(at, &x->ptr, sizeof(void *)); break;
        }
    }
}

/* -------------------------------------------------------------- generator */

/* A growing string that counts its lines (for #line after each snippet). */
typedef struct text {
    char *buf;
    size_t len, cap;
    int32_t lines;
    bool failed;
} text;

static void put(text *t, const char *s) {
    size_t n = strlen(s);
    if (t->failed) return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + n + 1) cap *= 2;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->failed = true;
            return;
        }
        t->buf = b, t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n + 1);
    t->len += n;
    for (const char *c = s; *c; c++) t->lines += *c == '\n';
}

static void putf(text *t, const char *fmt, ...) FI_PRINTF(2, 3);
static void putf(text *t, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    put(t, line);
}

/* A user snippet, numbered from line 1 of "<variant>.<what>" in compiler
 * messages; numbering of the generated text resumes after it. */
static void put_snippet(text *t, const fi_variant *v, const char *what, const char *body) {
    putf(t, "#line 1 \"%s.%s\"\n", v->spec.name, what);
    put(t, body);
    put(t, "\n");
    putf(t, "#line %d \"fi_variant_%s.h\"\n", (int)t->lines + 2, v->spec.name);
}

static const char *member_type(const fi_variant_param *p) {
    if (p->kind == FI_VARIANT_PARAM_F32) return "float";
    if (p->kind == FI_VARIANT_PARAM_I32) return "int32_t";
    switch (p->dtype) {
    case FI_DTYPE_F32: return "const float *";
    case FI_DTYPE_F16:
    case FI_DTYPE_BF16: return "const uint16_t *";
    case FI_DTYPE_I32: return "const int32_t *";
    default: return "const uint8_t *";
    }
}

static void put_prelude(text *t, const fi_variant *v, fi_variant_target target) {
    putf(t, "#line 1 \"fi_variant_%s.h\"\n", v->spec.name);
    putf(t, "/* Hooks of variant %s, generated by flashinfer.c (src/core/variant.c). */\n",
         v->spec.name);
    if (target == FI_VARIANT_TARGET_C) {
        put(t, "#include <math.h>\n#include <stdint.h>\n");
        put(t, "#define FI_HOOK static inline\n");
        put(t, "#define FI_STATIC_ASSERT _Static_assert\n");
    } else {
        /* NVRTC: fixed-width types come from the kernels' prelude. */
        put(t, "#define FI_HOOK __device__ __forceinline__\n");
        put(t, "#define FI_STATIC_ASSERT static_assert\n");
    }
    putf(t, "#define FI_VARIANT_NAME %s\n", v->spec.name);
    putf(t, "#define FI_VARIANT_USE_SOFTMAX %d\n", (int)v->spec.use_softmax);
    for (int i = 0; i < FI_HOOK_COUNT; i++) {
        char upper[32];
        size_t k = 0;
        for (const char *c = hook_names[i]; *c && k + 1 < sizeof upper; c++)
            upper[k++] = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
        upper[k] = 0;
        putf(t, "#define FI_VARIANT_HAS_%s %d\n", upper,
             fi_variant_hook(v, (fi_hook_id)i) != NULL);
    }
    put(t, "\n/* What a hook knows of the element it sees. */\n"
           "typedef struct fi_hook_ctx {\n"
           "    int32_t request;  /* batch index */\n"
           "    int32_t qo_head;  /* query head (query, logits, output hooks) */\n"
           "    int32_t kv_head;\n"
           "    int32_t q_pos;    /* kv_len - qo_len + i: bottom-right aligned */\n"
           "    int32_t kv_pos;   /* key index in the request's KV */\n"
           "    int32_t qo_len, kv_len;\n"
           "    int32_t head_dim; /* length of the row the hook sees */\n"
           "    float sm_scale;\n"
           "} fi_hook_ctx;\n\n");
    put(t, "/* The variant's per-run parameters (snippets read p.<name>). */\n"
           "typedef struct fi_variant_params {\n");
    for (int32_t i = 0; i < v->spec.num_params; i++) {
        const char *ty = member_type(&v->params[i]);
        size_t n = strlen(ty);
        putf(t, "    %s%s%s;\n", ty, ty[n - 1] == '*' ? "" : " ", v->params[i].name);
    }
    if (v->spec.num_params == 0) put(t, "    char fi_none;\n");
    put(t, "} fi_variant_params;\n");
    putf(t, "FI_STATIC_ASSERT(sizeof(fi_variant_params) == %d, \"fi_variant_params layout\");\n\n",
         (int)v->params_size);
    put(t, "FI_HOOK float fi_bits_float(uint32_t u) {\n"
           "    union { uint32_t u; float f; } x;\n"
           "    x.u = u;\n"
           "    return x.f;\n"
           "}\n"
           "/* Raw half / bfloat16 bits to float. */\n"
           "FI_HOOK float fi_f16(uint16_t h) {\n"
           "    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;\n"
           "    if (e == 0x1fu) return fi_bits_float(sign | 0x7f800000u | (m << 13));\n"
           "    if (e) return fi_bits_float(sign | ((e + 112u) << 23) | (m << 13));\n"
           "    float f = (float)m * 5.9604644775390625e-8f; /* m * 2^-24 */\n"
           "    return sign ? -f : f;\n"
           "}\n"
           "FI_HOOK float fi_bf16(uint16_t h) { return fi_bits_float((uint32_t)h << 16); }\n\n");
    /* fi_rope_row: the CUDA build's is kernels/variant.cuh's (same f32
     * angles, MUFU sin/cos after a Cody-Waite reduction) */
    if (target == FI_VARIANT_TARGET_C)
        put(t, "/* LLaMA RoPE on halves of x[dim] at pos: pair k turns by\n"
               " * (pos / scale) * 2^(-2k/dim log2 theta), in f32. */\n"
               "FI_HOOK void fi_rope_row(float *x, int32_t dim, int32_t pos, float scale, "
               "float theta) {\n"
               "    int32_t half = dim / 2;\n"
               "    float lt = log2f(theta), p = (float)pos / scale;\n"
               "    for (int32_t k = 0; k < half; k++) {\n"
               "        float a = p * exp2f((float)(-2 * k) / (float)dim * lt);\n"
               "        float cs = cosf(a), sn = sinf(a), x0 = x[k], x1 = x[k + half];\n"
               "        x[k] = x0 * cs - x1 * sn;\n"
               "        x[k + half] = x1 * cs + x0 * sn;\n"
               "    }\n"
               "}\n\n");
}

static void put_hooks(text *t, const fi_variant *v) {
    static const char *const heads[FI_HOOK_COUNT] = {
        "void fi_query_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *fi_p)",
        "void fi_key_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *fi_p)",
        "void fi_value_transform(float *x, const fi_hook_ctx *c, const fi_variant_params *fi_p)",
        "float fi_logits_transform(float s, const fi_hook_ctx *c, const fi_variant_params *fi_p)",
        "int fi_logits_mask(const fi_hook_ctx *c, const fi_variant_params *fi_p)",
        ("void fi_output_transform(float *o, float lse, const fi_hook_ctx *c,\n"
         "                                 const fi_variant_params *fi_p)"),
    };
    static const char *const unused[FI_HOOK_COUNT] = {
        "(void)x;", "(void)x;", "(void)x;", "(void)s;", "", "(void)o; (void)lse;",
    };
    static const char *const identity[FI_HOOK_COUNT] = {"", "", "", "return s;", "return 1;", ""};
    for (int i = 0; i < FI_HOOK_COUNT; i++) {
        const char *body = fi_variant_hook(v, (fi_hook_id)i);
        putf(t, "FI_HOOK %s {\n", heads[i]);
        putf(t, "    const fi_variant_params p = *fi_p;\n    (void)p; (void)c; %s\n", unused[i]);
        if (body) put_snippet(t, v, hook_names[i], body);
        else if (identity[i][0]) putf(t, "    %s\n", identity[i]);
        put(t, "}\n");
    }
}

char *fi_variant_source_alloc(const fi_variant *v, fi_variant_target target) {
    text t = {0};
    put_prelude(&t, v, target);
    if (v->spec.helpers) {
        put(&t, "/* helpers */\n");
        put_snippet(&t, v, "helpers", v->spec.helpers);
    }
    put_hooks(&t, v);
    if (t.failed) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}

size_t fi_variant_source(const fi_variant *v, fi_variant_target target, char *buf, size_t size) {
    if (!v || fi_variant_check(v, "fi_variant_source")) return 0;
    char *s = fi_variant_source_alloc(v, target);
    if (!s) {
        fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_variant_source: out of memory");
        return 0;
    }
    size_t n = strlen(s);
    if (buf && size > 0) {
        size_t k = n < size - 1 ? n : size - 1;
        memcpy(buf, s, k);
        buf[k] = 0;
    }
    free(s);
    return n;
}
