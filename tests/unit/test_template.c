/* Unit tests of the chat-template language: whitespace control, loops, scoping, macros, filters,
 * tests, operators, literals, printing, methods, globals, errors with line:col, and limits.
 *
 * The table's expected outputs were produced by Python's jinja2 3.1 configured as transformers
 * configures it (see scripts/make_template_golden.py); where jinja2 raised, `err` is 1 and the
 * expected text is jinja2's message (lumen must fail; its own message may differ). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "tokenizer/template/template.h"

typedef struct tcase {
    const char *name, *src, *ctx;
    int err;
    const char *want;
} tcase;

static const tcase cases[] = {
    {"ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", NULL, 0, "yes\nafter"},
    {"ws_lstrip", "a\n    {% if true %}\n    b\n    {% endif %}\nc", NULL, 0, "a\n    b\nc"},
    {"ws_minus", "a   {%- if true -%}   b   {%- endif -%}   c", NULL, 0, "abc"},
    {"ws_var_minus", "x \n {{- 'y' -}} \n z", NULL, 0, "xyz"},
    {"ws_plus", "a\n  {%+ if true %}b{% endif +%}\nc", NULL, 0, "a\n  b\nc"},
    {"ws_comment", "a\n  {# note #}\nb {#- x -#} c", NULL, 0, "a\nbc"},
    {"ws_var_no_lstrip", "a\n  {{ 'v' }}\n", NULL, 0, "a\n  v"},
    {"ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", NULL, 0, "a\nb\n"},
    {"ws_trailing_newline", "text\n", NULL, 0, "text"},
    {"ws_raw", "{% raw %}{{ not evaluated }}{% endraw %}!", NULL, 0, "{{ not evaluated }}!"},
    {"ws_lstrip_after_var", "{{ 'a' }}  {% if true %}b{% endif %}", NULL, 0, "a  b"},
    {"loop_vars", "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", NULL, 0, "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
    {"loop_prev_next", "{% for x in [1,2,3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}", NULL, 0, "[|2][1|3][2|]"},
    {"loop_cycle", "{% for x in range(4) %}{{ loop.cycle('odd','even') }} {% endfor %}", NULL, 0, "odd even odd even "},
    {"loop_else", "{% for x in [] %}x{% else %}empty{% endfor %}", NULL, 0, "empty"},
    {"loop_filter", "{% for x in range(10) if x is odd %}{{ x }}/{{ loop.length }} {% endfor %}", NULL, 0, "1/5 3/5 5/5 7/5 9/5 "},
    {"loop_unpack", "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }} {% endfor %}", NULL, 0, "a=1 b=2 "},
    {"loop_unpack_items_filter", "{% for k, v in d|items %}{{ k }}={{ v }} {% endfor %}", "{\"d\": {\"z\": 1, \"a\": [1, 2]}}", 0, "z=1 a=[1, 2] "},
    {"loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", NULL, 0, "0134"},
    {"loop_scope", "{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", NULL, 0, "1110"},
    {"loop_nested", "{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}", NULL, 0, "1x1 1y2 1|2x1 2y2 2|"},
    {"loop_dict_keys", "{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}", NULL, 0, "ba"},
    {"loop_string", "{% for ch in 'h\303\251llo' %}{{ ch }}.{% endfor %}", NULL, 0, "h.\303\251.l.l.o."},
    {"loop_none_error", "{% for x in none %}{% endfor %}", NULL, 1, "TypeError: 'NoneType' object is not iterable"},
    {"ns_counter", "{% set ns = namespace(n=0, found=false) %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% if i == 3 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.found }}", NULL, 0, "10 True"},
    {"set_tuple", "{% set a, b = 1, 'two' %}{{ a }}{{ b }}", NULL, 0, "1two"},
    {"set_block", "{% set x %}  inner {{ 1 + 1 }} {% endset %}[{{ x }}]", NULL, 0, "[  inner 2 ]"},
    {"set_block_filter", "{% set x | upper | trim %}  inner  {% endset %}[{{ x }}]", NULL, 0, "[INNER]"},
    {"if_set_leaks", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}", NULL, 0, "3"},
    {"macro_defaults", "{% macro m(a, b='x', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 2) }} {{ m(a=5, c=6) }}", NULL, 0, "1-x-None 1-2-None 5-x-6"},
    {"macro_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 }}{% endcall %}", NULL, 0, "<b>bold 1</b>"},
    {"macro_globals_late", "{% macro m() %}{{ q }}{% endmacro %}{% set q = 1 %}{{ m() }}{% set q = 2 %}{{ m() }}", NULL, 0, "12"},
    {"macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", NULL, 0, "120"},
    {"filter_block", "{% filter upper %}hello {{ 'world' }}{% endfilter %}", NULL, 0, "HELLO WORLD"},
    {"generation_block", "{% generation %}assistant text{% endgeneration %}!", NULL, 0, "assistant text!"},
    {"f_trim", "[{{ '  a b \n' | trim }}][{{ 'xxaxx'|trim('x') }}]", NULL, 0, "[a b][a]"},
    {"f_case", "{{ 'hELLo wOrld-foo'|upper }} {{ '\303\204bC'|lower }} {{ 'hello world-foo (bar)'|title }} {{ 'hELLO'|capitalize }}", NULL, 0, "HELLO WORLD-FOO \303\244bc Hello World-Foo (Bar) Hello"},
    {"f_replace", "{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '.') }}", NULL, 0, "a+b+c bba .a.b."},
    {"f_join", "{{ [1, 'a', none]|join(', ') }} {{ users|join('/', attribute='name') }}", "{\"users\": [{\"name\": \"x\"}, {\"name\": \"y\"}]}", 0, "1, a, None x/y"},
    {"f_default", "{{ u|default('d') }} {{ ''|default('e', true) }} {{ none|default('n') }} {{ false|d('f', true) }}", NULL, 0, "d e None f"},
    {"f_first_last", "{{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ 'abc'|first }}{{ 'abc'|last }}[{{ []|first }}]", NULL, 0, "13ac[]"},
    {"f_length", "{{ 'h\303\251llo'|length }} {{ [1,2]|count }} {{ {'a':1}|length }} {{ u|length }}", NULL, 0, "5 2 1 0"},
    {"f_list", "{{ 'ab'|list }} {{ {'k': 1}|list }} {{ range(3)|list }}", NULL, 0, "['a', 'b'] ['k'] [0, 1, 2]"},
    {"f_map_select", "{{ users|map(attribute='name')|join(',') }} {{ users|selectattr('admin')|map(attribute='name')|list }} {{ users|rejectattr('admin')|list|length }} {{ [1,2,3,4]|select('even')|list }} {{ [1,2,3,4]|reject('odd')|list }} {{ ['a','b']|map('upper')|list }}", "{\"users\": [{\"name\": \"ann\", \"admin\": true}, {\"name\": \"bob\", \"admin\": false}]}", 0, "ann,bob ['ann'] 1 [2, 4] [2, 4] ['A', 'B']"},
    {"f_selectattr_equalto", "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }} {{ msgs|selectattr('role', '==', 'tool')|list }}", "{\"msgs\": [{\"role\": \"user\"}, {\"role\": \"assistant\"}, {\"role\": \"user\"}]}", 0, "2 []"},
    {"f_map_default", "{{ items|map(attribute='x', default='-')|join }}", "{\"items\": [{\"x\": 1}, {}, {\"x\": 3}]}", 0, "1-3"},
    {"f_tojson", "{{ v|tojson }}|{{ v|tojson(indent=2) }}|{{ '\303\251\"\\n'|tojson }}|{{ '\303\251\360\237\232\200'|tojson(ensure_ascii=true) }}|{{ {'b':1,'a':2}|tojson(sort_keys=true) }}|{{ [1,2]|tojson(separators=(',', ':')) }}", "{\"v\": {\"a\": [1, 2.5, \"x\", null, true], \"b\": {}, \"c\": [], \"n\": -0.0}}", 0, "{\"a\": [1, 2.5, \"x\", null, true], \"b\": {}, \"c\": [], \"n\": -0.0}|{\n  \"a\": [\n    1,\n    2.5,\n    \"x\",\n    null,\n    true\n  ],\n  \"b\": {},\n  \"c\": [],\n  \"n\": -0.0\n}|\"\303\251\\\"\\n\"|\"\\u00e9\\ud83d\\ude80\"|{\"a\": 2, \"b\": 1}|[1,2]"},
    {"f_tojson_undefined_error", "{{ u|tojson }}", NULL, 1, "TypeError: Object of type Undefined is not JSON serializable"},
    {"f_string_num", "{{ 1|string }}{{ none|string }}{{ [1]|string }} {{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int(7) }} {{ '0x1A'|int(0, 16) }} {{ '2.5'|float }} {{ 'y'|float }} {{ 4|float }}", NULL, 0, "1None[1] 43 3 7 26 2.5 0.0 4.0"},
    {"f_abs_round", "{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 7|round }}", NULL, 0, "3 2.5 2.0 4.0 2.67 3.0 2.0 7"},
    {"f_items_dictsort", "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }}", "{\"d\": {\"b\": 2, \"A\": 3, \"c\": 1}}", 0, "[('b', 2), ('A', 3), ('c', 1)] [('A', 3), ('b', 2), ('c', 1)] [('A', 3), ('b', 2), ('c', 1)]"},
    {"f_unique_sort", "{{ ['b','A','a','B']|unique|list }} {{ ['b','A','a']|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='n')|join }}", "{\"users\": [{\"n\": \"x\", \"age\": 3}, {\"n\": \"y\", \"age\": 1}, {\"n\": \"z\", \"age\": 2}]}", 0, "['b', 'A'] ['A', 'a', 'b'] [3, 2, 1] yzx"},
    {"f_indent", "[{{ 'a\nb\n\nc'|indent }}][{{ 'a\nb'|indent(2, first=true) }}][{{ 'a\n\nb'|indent(1, blank=true) }}][{{ 'x\n'|indent('>') }}]", NULL, 0, "[a\n    b\n\n    c][  a\n  b][a\n \n b][x\n]"},
    {"f_safe_escape", "{{ '<a href=\"x\">&</a>'|e }} {{ '<b>'|safe }} {{ '<i>'|safe|escape }} {{ \"'\"|safe + \"<\" }}", NULL, 0, "&lt;a href=&#34;x&#34;&gt;&amp;&lt;/a&gt; <b> <i> '&lt;"},
    {"f_reverse", "{{ 'abc'|reverse }} {{ [1,2,3]|reverse|list }}", NULL, 0, "cba [3, 2, 1]"},
    {"f_batch_wordcount", "{{ range(5)|batch(2)|list }} {{ range(5)|batch(2, 0)|list }} {{ 'one two, three'|wordcount }}", NULL, 0, "[[0, 1], [2, 3], [4]] [[0, 1], [2, 3], [4, 0]] 3"},
    {"f_min_max_sum", "{{ [3,1,2]|min }} {{ ['b','A','c']|max }} {{ [1,2,3]|sum }} {{ items|sum(attribute='v') }}", "{\"items\": [{\"v\": 1.5}, {\"v\": 2}]}", 0, "1 c 6 3.5"},
    {"f_center_format", "[{{ 'ab'|center(6) }}] {{ '%s=%d'|format('x', 3) }} {{ '%s and %s' % ('a', 'b') }}", NULL, 0, "[  ab  ] x=3 a and b"},
    {"f_unknown", "{{ 1|nosuchfilter }}", NULL, 1, "TemplateAssertionError: No filter named 'nosuchfilter'."},
    {"t_types", "{{ u is defined }}{{ u is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ {} is mapping }}{{ [] is iterable }}{{ 'x' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ {} is sequence }}{{ true is boolean }}{{ 1 is integer }}{{ 1.0 is float }}", NULL, 0, "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrue"},
    {"t_values", "{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is equalto 'a' }}{{ 1 is eq 1.0 }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 2 is in [1,2] }}{{ none is sameas none }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 2 is gt 1 }}{{ 1 is ne 1 }}", NULL, 0, "TrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueFalse"},
    {"t_not", "{{ x is not none }}{{ x is not defined }}{{ not x is defined }}", "{\"x\": null}", 0, "FalseFalseFalse"},
    {"op_logic", "{{ true and 'x' }} {{ 0 or 'y' }} {{ not 0 }} {{ none or [] }} {{ 'a' and '' }}", NULL, 0, "x y True [] "},
    {"op_in", "{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ '' in 'x' }}", NULL, 0, "True True True True True"},
    {"op_compare", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 == 1.0 }} {{ 1 != '1' }} {{ none == none }} {{ u == v }}", NULL, 0, "True False True True True True True True"},
    {"op_arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2 * 3 - 4 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 0.1 + 0.2 }}", NULL, 0, "3 -4 1 2 3.5 3.0 1024 0.5 3 3.0 0.5 0.30000000000000004"},
    {"op_concat_ternary", "{{ 'a' ~ 1 ~ none ~ true ~ u }} {{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}] {{ -x }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ (1, 2) + (3,) }}", "{\"x\": 3}", 0, "a1NoneTrue y n [] -3 abab [1, 2] (1, 2, 3)"},
    {"op_str_plus_int_error", "{{ 'a' + 1 }}", NULL, 1, "TypeError: can only concatenate str (not \"int\") to str"},
    {"op_div_zero_error", "{{ 1 / 0 }}", NULL, 1, "ZeroDivisionError: division by zero"},
    {"op_compare_error", "{{ 1 < 'a' }}", NULL, 1, "TypeError: '<' not supported between instances of 'int' and 'str'"},
    {"lit_strings", "{{ 'it\\'s' }} {{ \"tab\\there\" }} {{ '\\u00e9\\x41' }} {{ 'a' 'b' \"c\" }} {{ '\\d' }}", NULL, 0, "it's tab\there \303\251A abc \\d"},
    {"lit_numbers", "{{ 1_000 }} {{ 1.5e3 }} {{ 1e-7 }} {{ 1e16 }} {{ 123456789.123456789 }} {{ 0.1 }} {{ 1/3 }} {{ 2.0 }} {{ 1e22 }} {{ -0.0 }} {{ 100.0 }}", NULL, 0, "1000 1500.0 1e-07 1e+16 123456789.12345679 0.1 0.3333333333333333 2.0 1e+22 -0.0 100.0"},
    {"lit_containers", "{{ [1, 'a', none, true, 1.0] }} {{ {'k': 'v', 'n': [1, {'x': none}]} }} {{ (1,) }} {{ () }} {{ (1, 'b') }} {{ [] }} {{ {} }}", NULL, 0, "[1, 'a', None, True, 1.0] {'k': 'v', 'n': [1, {'x': None}]} (1,) () (1, 'b') [] {}"},
    {"lit_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', '\303\251', '\\x00'] }}", NULL, 0, "[\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', '\303\251', '\\x00']"},
    {"lit_consts", "{{ True }}{{ true }}{{ False }}{{ None }}{{ none }}", NULL, 0, "TrueTrueFalseNoneNone"},
    {"acc_attr_item", "{{ m.role }} {{ m['content'] }} {{ m.get('x', 'dflt') }} {{ m.get('role') }} {{ m.missing }}|{{ l[0] }}{{ l[-1] }}{{ l[5] }}|{{ 'abc'[1] }}", "{\"m\": {\"role\": \"user\", \"content\": \"hi\"}, \"l\": [1, 2, 3]}", 0, "user hi dflt user |13|b"},
    {"acc_slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ 'h\303\251llo'[1:3] }} {{ 'abc'[::-1] }} {{ l[10:] }} {{ (1,2,3)[1:] }}", "{\"l\": [1, 2, 3, 4]}", 0, "[2, 3, 4] [1, 2, 3] [4, 3, 2, 1] [1, 3] \303\251l cba [] (2, 3)"},
    {"acc_dict_methods", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d['items'] }}", "{\"d\": {\"a\": 1, \"items\": \"key wins\"}}", 0, "['a', 'items'] [1, 'key wins'] [('a', 1), ('items', 'key wins')] key wins"},
    {"acc_undefined_attr_error", "{{ u.x }}", NULL, 1, "UndefinedError: 'u' is undefined"},
    {"acc_none_attr", "[{{ n.x }}]", "{\"n\": null}", 0, "[]"},
    {"acc_none_attr_chain_error", "{{ n.x.y }}", "{\"n\": null}", 1, "UndefinedError: 'None' has no attribute 'x'"},
    {"acc_loop_outside", "[{{ loop }}]", NULL, 0, "[]"},
    {"m_strip_split", "[{{ '  x  '.strip() }}][{{ 'xxhixx'.strip('x') }}][{{ '  x'.lstrip() }}][{{ 'x  '.rstrip() }}] {{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ' a  b '.split(none, 1) }}", NULL, 0, "[x][hi][x][x] ['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a,b', 'c'] ['a', 'b ']"},
    {"m_affix", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('x', 'lo')) }} {{ 'hello'.startswith('lo') }}", NULL, 0, "True True False"},
    {"m_case_replace", "{{ 'Hi'.upper() }} {{ 'Hi'.lower() }} {{ \"it's a-b\".title() }} {{ 'aXa'.replace('a', 'b') }} {{ 'hello'.capitalize() }}", NULL, 0, "HI hi It'S A-B bXb Hello"},
    {"m_format_join", "{{ '{} and {}'.format(1, 'two') }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{x}!'.format(x=5) }} {{ '{{}}'.format() }} {{ '-'.join(['a', 'b']) }}", NULL, 0, "1 and two aba 5! {} a-b"},
    {"m_find_count", "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }}", NULL, 0, "2 3 -1 2 True True"},
    {"m_list_append_unsafe", "{% set l = [] %}{% set _ = l.append(1) %}", NULL, 1, "SecurityError: access to attribute 'append' of 'list' object is unsafe."},
    {"m_dict_pop_unsafe", "{% set d = {} %}{{ d.pop('x') }}", NULL, 1, "SecurityError: access to attribute 'pop' of 'dict' object is unsafe."},
    {"g_raise", "{{ raise_exception('custom failure: ' ~ 42) }}", NULL, 1, "TemplateError: custom failure: 42"},
    {"g_range", "{{ range(5)|list }} {{ range(2, 8, 3)|list }} {{ range(5, 0, -2)|list }}", NULL, 0, "[0, 1, 2, 3, 4] [2, 5] [5, 3, 1]"},
    {"g_dict_namespace", "{{ dict(a=1, b='x') }} {% set ns = namespace(v=[]) %}{{ ns.v }}", NULL, 0, "{'a': 1, 'b': 'x'} []"},
    {"g_strftime", "{{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y %B') }}", NULL, 0, "2025-03-07 14:05:09 07 Mar 2025 March"},
    {"perr_unclosed_if", "a\n{% if true %}\nb", NULL, 1, "TemplateSyntaxError: Unexpected end of template. Jinja was looking for the following tags: 'elif' or 'else' or 'endif'. The innermost block that needs to be closed is 'if'."},
    {"perr_unknown_tag", "{% frobnicate %}", NULL, 1, "TemplateSyntaxError: Encountered unknown tag 'frobnicate'."},
    {"perr_bad_expr", "{{ 1 + }}", NULL, 1, "TemplateSyntaxError: unexpected 'end of print statement'"},
    {"perr_unclosed_var", "{{ 1 ", NULL, 1, "TemplateSyntaxError: unexpected end of template, expected 'end of print statement'."},
    {"perr_unclosed_string", "{{ 'abc }}", NULL, 1, "TemplateSyntaxError: unexpected char \"'\" at 3"},
    {"perr_endfor_mismatch", "{% if 1 %}{% endfor %}", NULL, 1, "TemplateSyntaxError: Encountered unknown tag 'endfor'. Jinja was looking for the following tags: 'elif' or 'else' or 'endif'. The innermost block that needs to be closed is 'if'."},
    {"perr_unclosed_comment", "{# abc", NULL, 1, "TemplateSyntaxError: Missing end of comment tag"},
};

/* 2025-03-07 14:05:09 local time, the instant the expected strftime_now output was made at */
static int64_t fixed_now(void) {
    struct tm tm = {.tm_year = 125, .tm_mon = 2, .tm_mday = 7, .tm_hour = 14, .tm_min = 5, .tm_sec = 9, .tm_isdst = -1};
    return (int64_t)mktime(&tm);
}

/* Renders src with ctx; returns the status, *out the text (caller frees) or NULL. */
static lm_status render(const char *src, const char *ctx, const lm_template_limits *lim, char **out) {
    lm_template *t = NULL;
    *out = NULL;
    lm_status st = lm_template_parse(src, strlen(src), &t);
    if (st != LM_OK) return st;
    size_t n = 0;
    st = lm_template_render_json(t, ctx, lim, out, &n);
    if (st == LM_OK) CHECK(strlen(*out) == n);
    lm_template_free(t);
    return st;
}

static void test_table(void) {
    lm_template_limits lim = {.now = fixed_now()};
    int pass = 0, n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        const tcase *c = &cases[i];
        char *out = NULL;
        lm_status st = render(c->src, c->ctx, &lim, &out);
        bool ok = c->err ? st != LM_OK : (st == LM_OK && strcmp(out, c->want) == 0);
        if (ok) pass++;
        else if (c->err) fprintf(stderr, "%s: jinja2 fails (%s) but lumen rendered [%s]\n", c->name, c->want, out);
        else if (st != LM_OK) fprintf(stderr, "%s: lumen failed: %s\n", c->name, lm_last_error());
        else fprintf(stderr, "%s:\n  want [%s]\n  got  [%s]\n", c->name, c->want, out);
        CHECK(ok);
        free(out);
    }
    printf("language table: %d/%d cases match jinja2\n", pass, n);
}

static void expect_parse_error(const char *src, const char *where) {
    lm_template *t = NULL;
    lm_status st = lm_template_parse(src, strlen(src), &t);
    CHECK(st == LM_ERR_FORMAT);
    CHECK(t == NULL);
    if (!strstr(lm_last_error(), where)) {
        fprintf(stderr, "parse error of [%s] is [%s], expected it to contain [%s]\n", src, lm_last_error(), where);
        lm_test_failures++;
    }
}

static void test_parse_error_positions(void) {
    expect_parse_error("line one\n{{ 1 + }}", "template:2:8:");
    expect_parse_error("a\n\n  {% frobnicate %}", "template:3:6:");
    expect_parse_error("{% if x %}\nno end", "or '{% endif %}'");
    expect_parse_error("{{ 'unterminated }}", "template:1:4:");
    expect_parse_error("{# no end", "template:1:1:");
    expect_parse_error("{% for x in y %}{% endif %}", "unexpected 'endif'");
    expect_parse_error("{% break %}", "outside of a loop");
    expect_parse_error("{{ a b }}", "template:1:6:");
    expect_parse_error("{{ f(a=1, 2) }}", "positional argument after keyword");
    expect_parse_error("{% set 1 = 2 %}", "cannot assign");
    lm_template *t = NULL;
    CHECK(lm_template_parse("{% include 'x' %}", 17, &t) == LM_ERR_UNSUPPORTED);
}

static void test_render_errors(void) {
    char *out = NULL;
    /* raise_exception carries the template's message and the line */
    CHECK(render("ok\n{{ raise_exception('Conversation roles must alternate') }}", NULL, NULL, &out) == LM_ERR_INVALID_ARG);
    CHECK(strstr(lm_last_error(), "Conversation roles must alternate") != NULL);
    CHECK(strstr(lm_last_error(), "line 2") != NULL);
    CHECK(out == NULL);
    CHECK(render("{{ x.y }}", NULL, NULL, &out) != LM_OK);
    CHECK(strstr(lm_last_error(), "'x' is undefined") != NULL);
    CHECK(render("{{ 1 }}", "[1, 2]", NULL, &out) == LM_ERR_INVALID_ARG);
    CHECK(render("{{ 1 }}", "{bad json", NULL, &out) == LM_ERR_INVALID_ARG);
}

static void test_limits(void) {
    char *out = NULL;
    lm_template_limits lim = {.max_steps = 100000};
    /* nested loops that would run 10^10 iterations stop with a clear error */
    CHECK(render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", NULL, &lim, &out) ==
          LM_ERR_LIMIT);
    CHECK(strstr(lm_last_error(), "steps") != NULL);
    /* output that doubles without bound */
    lm_template_limits small = {.max_output = 1 << 16, .max_memory = 8 << 20};
    CHECK(render("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                 NULL, &small, &out) == LM_ERR_LIMIT);
    CHECK(render("{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}", NULL,
                 &small, &out) == LM_ERR_LIMIT);
    CHECK(strstr(lm_last_error(), "output larger than") != NULL);
    /* unbounded recursion */
    CHECK(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &out) == LM_ERR_LIMIT);
    CHECK(strstr(lm_last_error(), "nested deeper") != NULL);
    /* the sandbox's range limit */
    CHECK(render("{{ range(1000000)|length }}", NULL, NULL, &out) == LM_ERR_LIMIT);
    /* nesting depth in the parser */
    char deep[2000];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 600; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 600; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    lm_template *t = NULL;
    CHECK(lm_template_parse(deep, strlen(deep), &t) == LM_ERR_LIMIT);
    CHECK(t == NULL);
    /* template size */
    CHECK(lm_template_parse("x", (size_t)LM_TEMPLATE_MAX_SOURCE + 1, &t) == LM_ERR_LIMIT);
    free(out);
}

static void test_chat_api(void) {
    const char *src = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                      "{% if tools is none %}[no tools]{% else %}{{ tools|length }} tools{% endif %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}{{ documents is none }}{{ enable_thinking }}";
    lm_template *t = NULL;
    CHECK(lm_template_parse(src, strlen(src), &t) == LM_OK);
    char *out = NULL;
    size_t n = 0;
    CHECK(lm_template_render_chat(t, "[{\"role\":\"user\",\"content\":\"hi \\u00e9\"}]", NULL, true, "<s>", "</s>", NULL, &out,
                                  &n) == LM_OK);
    CHECK(out && strcmp(out, "<s><user>hi \xc3\xa9[no tools]<assistant>True") == 0);
    free(out);
    CHECK(lm_template_render_chat(t, "[]", "[{\"type\":\"function\"}]", false, NULL, NULL, "{\"enable_thinking\": false}", &out,
                                  &n) == LM_OK);
    CHECK(out && strcmp(out, "1 toolsTrueFalse") == 0);
    free(out);
    CHECK(lm_template_render_chat(t, "{\"not\": \"a list\"}", NULL, true, NULL, NULL, NULL, &out, &n) == LM_ERR_INVALID_ARG);
    CHECK(out == NULL);
    CHECK(lm_template_render_chat(t, NULL, NULL, true, NULL, NULL, NULL, &out, &n) == LM_ERR_INVALID_ARG);
    lm_template_free(t);
    lm_template_free(NULL);
    CHECK(lm_template_parse(NULL, 0, NULL) == LM_ERR_INVALID_ARG);
}

static void test_json_numbers(void) {
    /* JSON integers stay ints and floats stay floats, as json.loads makes them */
    char *out = NULL;
    CHECK(render("{{ a }} {{ b }} {{ c }} {{ a is integer }} {{ b is float }} {{ d|tojson }}",
                 "{\"a\": 3, \"b\": 3.0, \"c\": 1e400, \"d\": {\"x\": [1, 2.50, -0.0, 12345678901234567890]}}", NULL,
                 &out) == LM_OK);
    CHECK(out && strcmp(out, "3 3.0 inf True True {\"x\": [1, 2.5, -0.0, 1.2345678901234567e+19]}") == 0);
    if (out && strcmp(out, "3 3.0 inf True True {\"x\": [1, 2.5, -0.0, 1.2345678901234567e+19]}"))
        fprintf(stderr, "json numbers: [%s]\n", out);
    free(out);
}

int main(void) {
    test_table();
    test_parse_error_positions();
    test_render_errors();
    test_limits();
    test_chat_api();
    test_json_numbers();
    TEST_MAIN_END();
}
