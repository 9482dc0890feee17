/*
 * The llama2.c / sentencepiece BPE tokenizer over a vocabulary with merge
 * scores.
 *
 * Encoding follows llama2.c's encode(): a dummy-prefix space token, one
 * token per UTF-8 code point (its bytes as <0xXX> byte tokens when the
 * code point is not in the vocabulary), then repeatedly the adjacent pair
 * whose concatenated text is a token with the highest score is merged, the
 * leftmost pair on ties.  llama2.c rescans every pair after each merge
 * (quadratic); here the candidate pairs sit in a heap ordered by (score,
 * position) and pairs made stale by a merge are skipped when popped, which
 * picks the same pair at every step in O(n log n).
 *
 * With PX_RT_ENCODE_SPECIAL the text is first cut at the texts of control
 * and user-defined tokens (leftmost, longest first, as the added-token
 * matcher of Hugging Face tokenizers does); each such text becomes its id
 * and every piece of ordinary text between them is encoded as above, with
 * its own dummy prefix (llama.cpp's parse_special does the same).
 */
#include "base/common.h"

#include "rt/rt_impl.h"

#define MAX_TEXT ((size_t)16 << 20)
/* U+2581 LOWER ONE EIGHTH BLOCK, sentencepiece's visible space. */
static const char SPM_SPACE[] = "\xe2\x96\x81";

struct px_rt_tokenizer {
    uint32_t n;
    char **text; /* token bytes as in the vocabulary */
    uint32_t *len;
    float *scores;
    const char **piece; /* decoded bytes */
    uint32_t *piece_len;
    int32_t *table; /* open addressing: token ids, -1 empty */
    size_t table_mask;
    int32_t byte_id[256];
    int32_t bos, eos, unk;
    uint32_t max_len;
    bool spm_spaces; /* the vocabulary writes spaces as U+2581 */
    char byte_pieces[256];
    uint8_t *type; /* px_token_type of each token */
    /* Control and user-defined tokens, for PX_RT_ENCODE_SPECIAL: an open
     * addressing table of their ids, and for each first byte the distinct
     * lengths of the special texts starting with it, longest first
     * (special_lens[special_first[b] .. special_first[b + 1]]). */
    int32_t *special_table;
    size_t special_mask;
    uint32_t *special_lens;
    uint32_t special_first[257];
};

static uint64_t hash_bytes(const char *s, size_t n)
{
    return px_hash64(s, n);
}

static int32_t lookup(const px_rt_tokenizer *t, const char *s, size_t n)
{
    for (size_t i = hash_bytes(s, n) & t->table_mask;; i = (i + 1) & t->table_mask) {
        int32_t id = t->table[i];
        if (id < 0)
            return -1;
        if (t->len[id] == n && !memcmp(t->text[id], s, n))
            return id;
    }
}

/* The control or user-defined token whose text is exactly s, or -1. */
static int32_t lookup_special(const px_rt_tokenizer *t, const char *s, size_t n)
{
    if (!t->special_table)
        return -1;
    for (size_t i = hash_bytes(s, n) & t->special_mask;; i = (i + 1) & t->special_mask) {
        int32_t id = t->special_table[i];
        if (id < 0)
            return -1;
        if (t->len[id] == n && !memcmp(t->text[id], s, n))
            return id;
    }
}

static bool is_special_type(uint8_t type)
{
    return type == PX_TOKEN_CONTROL || type == PX_TOKEN_USER_DEFINED;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* The byte a "<0xXX>" token stands for, or -1. */
static int byte_token(const char *s, uint32_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void px_rt_tokenizer_free(px_rt_tokenizer *t)
{
    if (!t)
        return;
    if (t->text)
        for (uint32_t i = 0; i < t->n; i++)
            free(t->text[i]);
    if (t->piece)
        for (uint32_t i = 0; i < t->n; i++)
            if (t->piece[i] && (t->piece[i] < t->byte_pieces ||
                                t->piece[i] >= t->byte_pieces + sizeof t->byte_pieces))
                free((void *)(uintptr_t)t->piece[i]);
    free(t->text);
    free(t->len);
    free(t->scores);
    free(t->piece);
    free(t->piece_len);
    free(t->table);
    free(t->type);
    free(t->special_table);
    free(t->special_lens);
    free(t);
}

/* The decoded form of token i: its byte, nothing for control tokens, or
 * its text with U+2581 turned into spaces. */
static px_status make_piece(px_rt_tokenizer *t, uint32_t i)
{
    int b = byte_token(t->text[i], t->len[i]);
    if (b >= 0) {
        t->piece[i] = &t->byte_pieces[b];
        t->piece_len[i] = 1;
        return PX_OK;
    }
    uint8_t type = t->type[i];
    char *p = malloc(t->len[i] + 1);
    if (!p)
        return PX_ENOMEM;
    uint32_t n = 0;
    if (type != PX_TOKEN_CONTROL && type != PX_TOKEN_UNKNOWN) {
        for (uint32_t j = 0; j < t->len[i];) {
            if (t->spm_spaces && t->len[i] - j >= 3 && !memcmp(t->text[i] + j, SPM_SPACE, 3)) {
                p[n++] = ' ';
                j += 3;
            } else {
                p[n++] = t->text[i][j++];
            }
        }
    }
    p[n] = '\0';
    t->piece[i] = p;
    t->piece_len[i] = n;
    return PX_OK;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Indexes the control and user-defined tokens (see the struct).  Where two
 * have the same text the lower id wins, as in the main table. */
static px_status index_special(px_rt_tokenizer *t)
{
    size_t n_special = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (is_special_type(t->type[i]) && t->len[i] > 0)
            n_special++;
    if (n_special == 0)
        return PX_OK;
    size_t cap = 16;
    while (cap < 2 * n_special)
        cap *= 2;
    t->special_mask = cap - 1;
    t->special_table = malloc(cap * sizeof *t->special_table);
    /* Sort keys: first byte in the high bits, then the length reversed so
     * that longer texts sort first. */
    uint64_t *keys = malloc(n_special * sizeof *keys);
    t->special_lens = malloc(n_special * sizeof *t->special_lens);
    if (!t->special_table || !keys || !t->special_lens) {
        free(keys);
        return PX_ENOMEM;
    }
    memset(t->special_table, 0xff, cap * sizeof *t->special_table);
    size_t k = 0;
    for (uint32_t i = 0; i < t->n; i++) {
        if (!is_special_type(t->type[i]) || t->len[i] == 0)
            continue;
        if (lookup_special(t, t->text[i], t->len[i]) < 0) {
            size_t h = hash_bytes(t->text[i], t->len[i]) & t->special_mask;
            while (t->special_table[h] >= 0)
                h = (h + 1) & t->special_mask;
            t->special_table[h] = (int32_t)i;
        }
        keys[k++] = (uint64_t)(unsigned char)t->text[i][0] << 32 | (UINT32_MAX - t->len[i]);
    }
    qsort(keys, k, sizeof *keys, cmp_u64);
    size_t n_lens = 0;
    memset(t->special_first, 0, sizeof t->special_first);
    for (size_t j = 0; j < k; j++) {
        if (j > 0 && keys[j] == keys[j - 1])
            continue;
        unsigned b = (unsigned)(keys[j] >> 32);
        t->special_lens[n_lens++] = UINT32_MAX - (uint32_t)keys[j];
        t->special_first[b + 1] = (uint32_t)n_lens;
    }
    /* Bytes with no special text start where the previous byte ended. */
    for (int b = 1; b <= 256; b++)
        if (t->special_first[b] < t->special_first[b - 1])
            t->special_first[b] = t->special_first[b - 1];
    free(keys);
    return PX_OK;
}

px_status px_rt_tokenizer_new(const px_ir_vocab *v, px_rt_tokenizer **out, px_err *err)
{
    *out = NULL;
    if (!v || v->n_tokens == 0 || !v->text || !v->len)
        return px_err_set(err, PX_EINVAL,
                          "tokenizer: the model carries no vocabulary (give a "
                          "tokenizer file)");
    if (v->model[0] && strcmp(v->model, "llama"))
        return px_err_set(err, PX_EUNSUPPORTED,
                          "tokenizer: the runtime tokenizes llama "
                          "(sentencepiece BPE) vocabularies; this one is \"%s\"",
                          v->model);
    if (v->n_tokens > (1u << 22))
        return px_err_set(err, PX_ELIMIT, "tokenizer: %u tokens (at most 4M)", v->n_tokens);
    px_rt_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return px_err_set(err, PX_ENOMEM, "tokenizer: out of memory");
    uint32_t n = v->n_tokens;
    t->n = n;
    t->bos = v->bos_id;
    t->eos = v->eos_id;
    t->unk = v->unk_id;
    size_t cap = 16;
    while (cap < 2 * (size_t)n)
        cap *= 2;
    t->table_mask = cap - 1;
    t->text = calloc(n, sizeof *t->text);
    t->len = calloc(n, sizeof *t->len);
    t->scores = calloc(n, sizeof *t->scores);
    t->piece = calloc(n, sizeof *t->piece);
    t->piece_len = calloc(n, sizeof *t->piece_len);
    t->table = malloc(cap * sizeof *t->table);
    t->type = malloc(n);
    if (!t->text || !t->len || !t->scores || !t->piece || !t->piece_len || !t->table || !t->type)
        goto fail_oom;
    memset(t->table, 0xff, cap * sizeof *t->table);
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = -1;
        t->byte_pieces[b] = (char)b;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = v->len[i];
        if (len > 65536) {
            px_rt_tokenizer_free(t);
            return px_err_set(err, PX_ELIMIT, "tokenizer: token %u is %u bytes long", i, len);
        }
        t->text[i] = malloc(len + 1);
        if (!t->text[i])
            goto fail_oom;
        memcpy(t->text[i], v->text[i], len);
        t->text[i][len] = '\0';
        t->len[i] = len;
        t->scores[i] = v->scores ? v->scores[i] : 0.0f;
        t->type[i] = v->types ? v->types[i] : (uint8_t)PX_TOKEN_NORMAL;
        t->max_len = PX_MAX(t->max_len, len);
        /* Keep the lowest id of duplicated texts. */
        if (lookup(t, t->text[i], len) < 0) {
            size_t h = hash_bytes(t->text[i], len) & t->table_mask;
            while (t->table[h] >= 0)
                h = (h + 1) & t->table_mask;
            t->table[h] = (int32_t)i;
        }
        int b = byte_token(t->text[i], len);
        if (b >= 0 && t->byte_id[b] < 0)
            t->byte_id[b] = (int32_t)i;
    }
    t->spm_spaces = lookup(t, " ", 1) < 0 && lookup(t, SPM_SPACE, 3) >= 0;
    for (uint32_t i = 0; i < n; i++)
        if (make_piece(t, i) != PX_OK)
            goto fail_oom;
    if (index_special(t) != PX_OK)
        goto fail_oom;
    *out = t;
    return PX_OK;
fail_oom:
    px_rt_tokenizer_free(t);
    return px_err_set(err, PX_ENOMEM, "tokenizer: out of memory");
}

uint32_t px_rt_tokenizer_n_tokens(const px_rt_tokenizer *t)
{
    return t->n;
}

int32_t px_rt_tokenizer_bos(const px_rt_tokenizer *t)
{
    return t->bos;
}

int32_t px_rt_tokenizer_eos(const px_rt_tokenizer *t)
{
    return t->eos;
}

px_status px_rt_tokenizer_decode(const px_rt_tokenizer *t, int32_t prev, int32_t token,
                                 const char **piece, size_t *len, px_err *err)
{
    if (token < 0 || (uint32_t)token >= t->n)
        return px_err_set(err, PX_EINVAL, "tokenizer: token %d is outside the vocabulary [0, %u)",
                          token, t->n);
    const char *p = t->piece[token];
    size_t n = t->piece_len[token];
    /* After BOS, sentencepiece's decoder drops the dummy-prefix space. */
    if (prev == t->bos && t->bos >= 0 && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    *piece = p;
    *len = n;
    return PX_OK;
}

int32_t px_rt_tokenizer_find(const px_rt_tokenizer *t, const char *text, size_t len)
{
    if (!text || len == 0 || len > t->max_len)
        return -1;
    int32_t id = lookup_special(t, text, len);
    return id >= 0 ? id : lookup(t, text, len);
}

px_token_type px_rt_tokenizer_token_type(const px_rt_tokenizer *t, int32_t token)
{
    if (token < 0 || (uint32_t)token >= t->n)
        return PX_TOKEN_UNDEFINED;
    return (px_token_type)t->type[token];
}

px_status px_rt_tokenizer_token_text(const px_rt_tokenizer *t, int32_t token, const char **text,
                                     size_t *len, px_err *err)
{
    if (token < 0 || (uint32_t)token >= t->n)
        return px_err_set(err, PX_EINVAL, "tokenizer: token %d is outside the vocabulary [0, %u)",
                          token, t->n);
    /* Control and unknown tokens decode to nothing; here they show. */
    if (t->type[token] == PX_TOKEN_CONTROL || t->type[token] == PX_TOKEN_UNKNOWN) {
        *text = t->text[token];
        *len = t->len[token];
    } else {
        *text = t->piece[token];
        *len = t->piece_len[token];
    }
    return PX_OK;
}

/* ------------------------------------------------------------------ */
/* Encoding                                                            */
/* ------------------------------------------------------------------ */

typedef struct cand {
    float score;
    uint32_t left, right; /* symbol indexes */
    uint32_t left_ver, right_ver;
    int32_t id;
} cand;

typedef struct encoder {
    const px_rt_tokenizer *t;
    int32_t *tok; /* symbol tokens */
    int32_t *prev, *next;
    uint32_t *ver; /* bumped when a symbol changes or dies */
    cand *heap;
    size_t n_heap, cap_heap;
    char *buf; /* two tokens' texts */
} encoder;

/* Heap order: higher score first, then the leftmost pair. */
static bool before(const cand *a, const cand *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    return a->left < b->left;
}

static void heap_push(encoder *e, cand c)
{
    PX_ASSERT(e->n_heap < e->cap_heap);
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&c, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
}

static cand heap_pop(encoder *e)
{
    cand top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->n_heap)
            break;
        if (c + 1 < e->n_heap && before(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!before(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->n_heap)
        e->heap[i] = last;
    return top;
}

/* Pushes the pair (a, a's next) if its concatenation is a token. */
static void consider(encoder *e, uint32_t a)
{
    int32_t b = e->next[a];
    if (b < 0)
        return;
    const px_rt_tokenizer *t = e->t;
    int32_t ta = e->tok[a], tb = e->tok[b];
    memcpy(e->buf, t->text[ta], t->len[ta]);
    memcpy(e->buf + t->len[ta], t->text[tb], t->len[tb]);
    int32_t id = lookup(t, e->buf, (size_t)t->len[ta] + t->len[tb]);
    /* llama2.c starts its search at -1e10: lower scores never merge. */
    if (id < 0 || !(t->scores[id] > -1e10f))
        return;
    heap_push(e, (cand){t->scores[id], a, (uint32_t)b, e->ver[a], e->ver[b], id});
}

/* Turns text into initial symbols: code points, or their bytes. */
static px_status split_code_points(const px_rt_tokenizer *t, const char *s, size_t n, int32_t *tok,
                                   size_t *n_tok, px_err *err)
{
    size_t i = 0;
    while (i < n) {
        size_t len = 1;
        /* llama2.c's grouping: a byte and the continuation bytes after it,
         * at most four bytes in all. */
        while (i + len < n && ((unsigned char)s[i + len] & 0xC0) == 0x80 && len < 4)
            len++;
        int32_t id = lookup(t, s + i, len);
        if (id >= 0) {
            tok[(*n_tok)++] = id;
        } else {
            for (size_t j = 0; j < len; j++) {
                unsigned char c = (unsigned char)s[i + j];
                int32_t b = t->byte_id[c] >= 0 ? t->byte_id[c] : t->unk;
                if (b < 0)
                    return px_err_set(err, PX_EUNSUPPORTED,
                                      "tokenizer: byte 0x%02x at offset "
                                      "%zu has no token and the vocabulary has no byte "
                                      "fallback",
                                      c, i + j);
                tok[(*n_tok)++] = b;
            }
        }
        i += len;
    }
    return PX_OK;
}

/* Where encoded ids go: written while they fit, counted always, so that a
 * caller whose buffer is short learns how many it needs. */
typedef struct id_sink {
    int32_t *ids;
    size_t cap, n;
} id_sink;

static void sink_put(id_sink *s, int32_t id)
{
    if (s->n < s->cap)
        s->ids[s->n] = id;
    s->n++;
}

/* Encodes ordinary text (no special tokens): the dummy prefix, code
 * points, then the merges. */
static px_status encode_text(const px_rt_tokenizer *t, const char *text, size_t len, id_sink *out,
                             px_err *err)
{
    if (len == 0)
        return PX_OK;
    /* The text as the vocabulary writes it, with the dummy prefix space. */
    size_t norm_cap = 3 * (len + 1), n_norm = 0;
    char *norm = malloc(norm_cap);
    size_t max_sym = norm_cap + 2;
    encoder e = {.t = t};
    e.tok = malloc(max_sym * sizeof *e.tok);
    e.prev = malloc(max_sym * sizeof *e.prev);
    e.next = malloc(max_sym * sizeof *e.next);
    e.ver = calloc(max_sym, sizeof *e.ver);
    e.cap_heap = 3 * max_sym;
    e.heap = malloc(e.cap_heap * sizeof *e.heap);
    e.buf = malloc(2 * (size_t)t->max_len + 1);
    px_status st = PX_OK;
    if (!norm || !e.tok || !e.prev || !e.next || !e.ver || !e.heap || !e.buf) {
        st = px_err_set(err, PX_ENOMEM, "tokenizer: out of memory for %zu bytes of text", len);
        goto done;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ' && t->spm_spaces) {
            memcpy(norm + n_norm, SPM_SPACE, 3);
            n_norm += 3;
        } else {
            norm[n_norm++] = text[i];
        }
    }
    size_t n_sym = 0;
    int32_t prefix = t->spm_spaces ? lookup(t, SPM_SPACE, 3) : lookup(t, " ", 1);
    if (prefix >= 0)
        e.tok[n_sym++] = prefix;
    if ((st = split_code_points(t, norm, n_norm, e.tok, &n_sym, err)) != PX_OK)
        goto done;
    for (size_t i = 0; i < n_sym; i++) {
        e.prev[i] = (int32_t)i - 1;
        e.next[i] = i + 1 < n_sym ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n_sym; i++)
        consider(&e, (uint32_t)i);
    while (e.n_heap) {
        cand c = heap_pop(&e);
        if (e.ver[c.left] != c.left_ver || e.ver[c.right] != c.right_ver ||
            e.next[c.left] != (int32_t)c.right)
            continue; /* stale: a side merged since */
        /* Merge right into left. */
        e.tok[c.left] = c.id;
        e.ver[c.left]++;
        e.ver[c.right]++;
        e.next[c.left] = e.next[c.right];
        if (e.next[c.right] >= 0)
            e.prev[e.next[c.right]] = (int32_t)c.left;
        e.tok[c.right] = -1;
        if (e.prev[c.left] >= 0)
            consider(&e, (uint32_t)e.prev[c.left]);
        consider(&e, c.left);
    }
    for (int32_t i = n_sym ? 0 : -1; i >= 0; i = e.next[i])
        sink_put(out, e.tok[i]);
done:
    free(norm);
    free(e.tok);
    free(e.prev);
    free(e.next);
    free(e.ver);
    free(e.heap);
    free(e.buf);
    return st;
}

/* The control or user-defined token whose text starts s (at most n
 * bytes), the longest when several do; -1 when none. */
static int32_t match_special(const px_rt_tokenizer *t, const char *s, size_t n, size_t *match_len)
{
    unsigned b = (unsigned char)s[0];
    for (uint32_t j = t->special_first[b]; j < t->special_first[b + 1]; j++) {
        uint32_t len = t->special_lens[j];
        if (len > n)
            continue;
        int32_t id = lookup_special(t, s, len);
        if (id >= 0) {
            *match_len = len;
            return id;
        }
    }
    return -1;
}

/* Encodes text with the texts of special tokens as their ids, the
 * ordinary pieces between them as encode_text does. */
static px_status encode_special(const px_rt_tokenizer *t, const char *text, size_t len,
                                id_sink *out, px_err *err)
{
    size_t start = 0, i = 0;
    while (i < len) {
        size_t mlen = 0;
        int32_t id = t->special_table ? match_special(t, text + i, len - i, &mlen) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        px_status st = encode_text(t, text + start, i - start, out, err);
        if (st != PX_OK)
            return st;
        sink_put(out, id);
        i += mlen;
        start = i;
    }
    return encode_text(t, text + start, len - start, out, err);
}

px_status px_rt_tokenizer_encode(const px_rt_tokenizer *t, const char *text, size_t len,
                                 unsigned flags, int32_t *ids, size_t cap, size_t *n_ids,
                                 px_err *err)
{
    *n_ids = 0;
    if (len > MAX_TEXT)
        return px_err_set(err, PX_ELIMIT, "tokenizer: text of %zu bytes (at most %zu)", len,
                          MAX_TEXT);
    if ((flags & PX_RT_ENCODE_BOS && t->bos < 0) || (flags & PX_RT_ENCODE_EOS && t->eos < 0))
        return px_err_set(err, PX_EINVAL, "tokenizer: the vocabulary has no %s token",
                          flags & PX_RT_ENCODE_BOS && t->bos < 0 ? "BOS" : "EOS");
    id_sink sink = {ids, cap, 0};
    if (flags & PX_RT_ENCODE_BOS)
        sink_put(&sink, t->bos);
    px_status st = flags & PX_RT_ENCODE_SPECIAL ? encode_special(t, text, len, &sink, err)
                                                : encode_text(t, text, len, &sink, err);
    if (st != PX_OK)
        return st;
    if (flags & PX_RT_ENCODE_EOS)
        sink_put(&sink, t->eos);
    *n_ids = sink.n;
    if (sink.n > cap)
        return px_err_set(err, PX_ELIMIT, "tokenizer: the text needs %zu tokens; room for %zu",
                          sink.n, cap);
    return PX_OK;
}
