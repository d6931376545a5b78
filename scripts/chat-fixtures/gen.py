"""Chat-template parity fixtures for router/tokenize/chat.

usage: python3 gen.py prepare TOKENIZERS_DIR WORK_DIR
       python3 gen.py collect WORK_DIR OUT_DIR

prepare writes, per template, templates-<name>.json and conversations-<name>.json
in the input format of render_py.py (the reference renderer in the shared oracle
folder), after converting each OpenAI request body the way vLLM's chat endpoint
does (content format detected from the template AST as vLLM does, content parts
flattened, tool-call arguments parsed, tools dumped in pydantic field order,
chat_template_kwargs filtered to the template's variables). run.sh then renders
them with render_py.py; collect applies transformers' continue_final_message cut
and writes the golden files OUT_DIR/parity.json and OUT_DIR/whitespace.json.

Everything is derived from fixed seeds: the same inputs give the same files.
Needs only Python 3 and jinja2 (Debian package python3-jinja2)."""
import json
import os
import random
import sys
from collections import deque

import jinja2
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

MODELS = ["qwen2_5", "qwen3", "mistral_nemo"]

# A template written for these fixtures (not a model's): it loops over
# message content, so vLLM's auto detection picks the "openai" format.
OPENAI_TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
    {{- '<|' + message['role'] + '|>\\n' }}
    {%- if message['content'] is string %}
        {{- message['content'] }}
    {%- else %}
        {%- for part in message['content'] %}
            {%- if part['type'] == 'text' %}
                {{- part['text'] }}
            {%- elif part['type'] == 'image' %}
                {{- '<|image|>' }}
            {%- endif %}
            {%- if not loop.last %} {% endif %}
        {%- endfor %}
    {%- endif %}
    {{- eos_token + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}
{#- a comment at the end -#}
"""

# ---------------------------------------------------------------- vLLM port


def _is_var_access(node, varname):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == varname


def _is_attr_access(node, varname, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return (_is_var_access(node.node, varname) and isinstance(node.arg, jinja2.nodes.Const)
                and node.arg.value == key)
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node, varname, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _assign_vars(root, varname):
    yield varname
    related = deque([varname])
    while related:
        name = related.popleft()
        for a in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems_access(a.node, name):
                assert isinstance(a.target, jinja2.nodes.Name)
                yield a.target.name
                if a.target.name != name:
                    related.append(a.target.name)


def _message_vars(root):
    msgs = list(_assign_vars(root, "messages"))
    for loop in root.find_all(jinja2.nodes.For):
        for name in msgs:
            if _is_var_or_elems_access(loop.iter, name):
                yield loop.target.name
                break


def detect_content_format(env, source):
    """vLLM's _detect_content_format on the Jinja2 AST."""
    root = env.parse(source)
    msg_vars = list(_message_vars(root))
    for loop in root.find_all(jinja2.nodes.For):
        for name in msg_vars:
            if _is_var_or_elems_access(loop.iter, name, "content"):
                return "openai"
    return "string"


MEDIA = {"image_url": "image", "input_image": "image", "image_embeds": "image", "image_pil": "image",
         "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio", "video_url": "video"}


def convert_part(part):
    if isinstance(part, str):
        return "text", part
    t = part.get("type")
    if t is None:
        for k in ("image_url", "image_embeds", "audio_url", "input_audio", "audio_embeds", "video_url"):
            if k in part:
                return MEDIA[k], None
        raise ValueError("Missing 'type' field in multimodal part.")
    if t in ("text", "input_text", "output_text", "refusal", "thinking"):
        key = {"refusal": "refusal", "thinking": "thinking"}.get(t, "text")
        v = part.get(key)
        return (None, None) if v is None else ("text", v)
    if t in MEDIA:
        return MEDIA[t], None
    raise ValueError(f"Unsupported chat content part type: {t!r}")


def convert_message(msg, fmt):
    role = msg["role"]
    content = msg.get("content")
    parts = [] if content is None else ([content] if isinstance(content, str) else content)
    texts, out = [], []
    for p in parts:
        kind, text = convert_part(p)
        if kind is None:
            continue
        if kind == "text":
            texts.append(text)
            out.append({"type": "text", "text": text})
        else:
            out.append({"type": kind})
    if fmt == "openai":
        new_content = out
        if role == "tool" and all(p["type"] == "text" for p in out):
            new_content = "\n".join(texts)
    else:
        new_content = "\n".join(texts)
    res = {"role": role, "content": new_content}
    for k, v in msg.items():
        if k not in ("role", "content"):
            res[k] = v
    if role == "assistant":
        if "tool_calls" in res:
            tc = res["tool_calls"]
            if tc is None or tc == []:
                del res["tool_calls"]
            else:
                calls = []
                for call in tc:
                    fn = dict(call["function"])
                    a = fn.get("arguments")
                    if isinstance(a, str):
                        try:
                            fn["arguments"] = json.loads(a)
                        except json.JSONDecodeError:
                            fn["arguments"] = {}
                    elif not isinstance(a, (dict, list)):
                        fn["arguments"] = {}
                    c = dict(call)
                    c["function"] = fn
                    calls.append(c)
                res["tool_calls"] = calls
        r = msg.get("reasoning")
        if r is None:
            r = msg.get("reasoning_content")
        if r is not None:
            res["reasoning"] = r
            res["reasoning_content"] = r
    return res


def convert_tools(tools):
    out = []
    for t in tools:
        fn = t["function"]
        nf = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        for k, v in fn.items():
            nf.setdefault(k, v)
        nt = {"type": t.get("type", "function"), "function": nf}
        for k, v in t.items():
            nt.setdefault(k, v)
        out.append(nt)
    return out


HF_PARAMS = {"add_generation_prompt", "continue_final_message", "tools", "documents"}


def prepare_request(body, fmt, template_vars):
    """An OpenAI request body to render_py.py's conversation entry, or an error."""
    agp = body.get("add_generation_prompt", True)
    cfm = body.get("continue_final_message", False)
    if agp and cfm:
        raise ValueError("Cannot set both continue_final_message and add_generation_prompt")
    msgs = [convert_message(m, fmt) for m in body["messages"]]
    tools = convert_tools(body["tools"]) if body.get("tools") is not None else None
    kwargs = {}
    for k, v in (body.get("chat_template_kwargs") or {}).items():
        if k in ("chat_template", "tokenize"):
            continue
        if k == "continue_final_message":
            cfm = bool(v)
            continue
        if k in ("add_generation_prompt", "tools"):
            # render_py.py sets these itself; an override replaces them.
            if k == "add_generation_prompt":
                agp = v
            else:
                tools = v
            continue
        if k in template_vars or k in HF_PARAMS:
            kwargs[k] = v
    final = msgs[-1]["content"]
    if isinstance(final, list):
        final = next((b["text"] for b in reversed(final) if "text" in b), None)
    return {"messages": msgs, "tools": tools, "add_generation_prompt": agp, "kwargs": kwargs}, cfm, final


def continue_final(rendered, final):
    """transformers' continue_final_message cut."""
    if final is None:
        raise ValueError("continue_final_message: no text to continue in the final message")
    if final.strip() not in rendered:
        raise ValueError("continue_final_message: the final message does not appear in the chat")
    loc = rendered.rindex(final.strip())
    if rendered[loc:loc + len(final.lstrip())] == final:
        return rendered[:loc + len(final.lstrip())]
    return rendered[:loc + len(final.strip())]

# ---------------------------------------------------------------- requests

WORDS = ["the", "cache", "router", "prefix", "token", "engine", "latency", "batch", "GPU", "queue",
         "naïve", "café", "Zürich", "東京", "缓存", "路由器", "한국어", "🚀", "🙂", "👩‍💻", "Ω≈ç√",
         "\"quoted\"", "back\\slash", "tab\there", "{{ not a tag }}", "{% nope %}", "<|im_start|>",
         "[INST]", "</s>", "\u00a0nbsp", "line\nbreak", "   spaced   ", "0.5", "1e3", "null"]


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def call_id(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(9))


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — returns °C.",
        "parameters": {
            "type": "object",
            "properties": {
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "city": {"type": "string", "description": "City name, e.g. 東京 or Zürich"},
                "days": {"type": "integer", "minimum": 1, "maximum": 10.0, "multipleOf": 0.5},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the knowledge base.",
        "parameters": {
            "type": "object",
            "properties": {
                "zeta": {"type": "number", "exclusiveMinimum": 1e-07, "examples": [1e21, 123456789012345678]},
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "after": {"type": "string", "format": "date"},
                        "nested": {"type": "object", "properties": {"b": {"type": "null"}, "a": {"type": "boolean"}}},
                    },
                },
            },
            "required": ["query", "zeta"],
        },
    },
}

BARE_TOOL = {"type": "function", "function": {"name": "ping", "strict": True, "parameters": {"type": "object", "properties": {}}}}


def requests():
    """The request bodies, in a fixed order. Names are stable fixture keys."""
    rng = random.Random(20240601)
    R = []

    def add(name, **body):
        R.append({"name": name, "body": body})

    sys_msg = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
    add("user_only", messages=[{"role": "user", "content": "Hello!"}])
    add("system_user", messages=[sys_msg, {"role": "user", "content": "What is a KV cache?"}])
    add("multi_turn", messages=[sys_msg, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
                                {"role": "user", "content": "Explain prefix caching."}])
    add("three_rounds_no_system", messages=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"}])
    add("no_generation_prompt", add_generation_prompt=False, messages=[
        {"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}])
    add("no_generation_prompt_user_last", add_generation_prompt=False, messages=[{"role": "user", "content": "Say hi"}])
    add("tools_question", tools=[WEATHER_TOOL, SEARCH_TOOL], messages=[sys_msg, {"role": "user", "content": "Weather in Zürich?"}])
    add("tools_no_system", tools=[WEATHER_TOOL], messages=[{"role": "user", "content": "Weather in 東京?"}])
    cid = call_id(rng)
    add("tool_call_string_args", tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"unit\": \"celsius\", \"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": cid, "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}])
    cid = call_id(rng)
    add("tool_call_object_args", tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": cid, "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}]},
        {"role": "tool", "tool_call_id": cid, "content": "snow"},
        {"role": "assistant", "content": "It is snowing in Oslo."},
        {"role": "user", "content": "Thanks"}])
    c1, c2 = call_id(rng), call_id(rng)
    add("parallel_tool_calls", tools=[WEATHER_TOOL, SEARCH_TOOL], messages=[
        sys_msg, {"role": "user", "content": "Weather in Rome and docs on caching"},
        {"role": "assistant", "content": "Let me check both.", "tool_calls": [
            {"id": c1, "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}},
            {"id": c2, "type": "function", "function": {"name": "search_docs", "arguments": "{\"query\": \"cache\", \"zeta\": 2}"}}]},
        {"role": "tool", "tool_call_id": c1, "content": "sunny"},
        {"role": "tool", "tool_call_id": c2, "content": "Prefix caching reuses KV blocks."}])
    cid = call_id(rng)
    add("tool_call_bad_json_args", tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": cid, "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": cid, "content": "err"}])
    add("tool_call_bad_id", tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "err"}])
    add("empty_tool_calls_dropped", messages=[
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": []}, {"role": "user", "content": "q2"}])
    add("unicode", messages=[{"role": "system", "content": "Réponds en français 🇫🇷"},
                             {"role": "user", "content": "東京の天気は？ 缓存是什么？ 🚀👩‍💻 Ω≈ç√ \u00a0 \u2028 end"}])
    add("content_parts_text", messages=[{"role": "user", "content": [
        {"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]}])
    add("content_parts_with_image", messages=[{"role": "user", "content": [
        {"type": "text", "text": "Describe:"}, {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}},
        "a bare string part", {"type": "text", "text": "Thanks."}]}])
    add("tool_content_parts", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "abc123xyz", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "abc123xyz", "content": [{"type": "text", "text": "pong"}, {"type": "text", "text": "again"}]}],
        tools=[BARE_TOOL])
    add("empty_content", messages=[{"role": "user", "content": ""}])
    add("null_user_content", messages=[{"role": "user", "content": None}])
    add("whitespace_content", messages=[{"role": "user", "content": "  \n\t  "}])
    long_text = words(random.Random(7), 700)
    add("long_messages", messages=[sys_msg, {"role": "user", "content": long_text},
                                   {"role": "assistant", "content": words(random.Random(8), 400)},
                                   {"role": "user", "content": "Summarise the above."}])
    add("continue_final", add_generation_prompt=False, continue_final_message=True, messages=[
        {"role": "user", "content": "Write a haiku"}, {"role": "assistant", "content": "Autumn moonlight—"}])
    add("continue_final_trailing_space", add_generation_prompt=False, continue_final_message=True, messages=[
        {"role": "user", "content": "Count"}, {"role": "assistant", "content": "  one, two, "}])
    add("continue_and_generation_prompt", continue_final_message=True, messages=[
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])
    add("kwargs_enable_thinking_false", chat_template_kwargs={"enable_thinking": False, "unused_var": 1},
        messages=[{"role": "user", "content": "Quick answer: 2+2?"}])
    add("kwargs_override_generation_prompt", chat_template_kwargs={"add_generation_prompt": False},
        messages=[{"role": "user", "content": "hi"}])
    add("reasoning_content", messages=[
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add two and two."},
        {"role": "user", "content": "3+3?"}])
    add("think_tags_in_content", messages=[
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsimple sum\n</think>\n\n4"},
        {"role": "user", "content": "and 5+5?"}])
    add("roles_not_alternating", messages=[{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
    add("system_only", messages=[sys_msg])
    add("tool_without_description", tools=[BARE_TOOL], messages=[{"role": "user", "content": "ping it"}])
    add("special_characters", messages=[{"role": "user", "content": "quotes \" ' backslash \\ {{ x }} {% if %} <|im_end|> [INST] </s>\n\nnew para\r\nCRLF"}])
    add("name_and_extra_fields", messages=[{"role": "user", "name": "alice", "content": "Hi", "x_custom": {"b": 1, "a": [2]}}])
    add("developer_role", messages=[{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "hi"}])
    add("unknown_role", messages=[{"role": "narrator", "content": "Once upon a time"}, {"role": "user", "content": "go on"}])
    add("documents_ignored", documents=[{"title": "a", "text": "b"}], messages=[{"role": "user", "content": "q"}])
    for i in range(8):
        r = random.Random(1000 + i)
        msgs = []
        if r.random() < 0.5:
            msgs.append({"role": "system", "content": words(r, r.randint(1, 30))})
        for t in range(r.randint(1, 4)):
            msgs.append({"role": "user", "content": words(r, r.randint(0, 40))})
            msgs.append({"role": "assistant", "content": words(r, r.randint(1, 40))})
        msgs.append({"role": "user", "content": words(r, r.randint(1, 20))})
        add(f"random_{i}", messages=msgs)
    return R

# ---------------------------------------------------------------- whitespace


FRAGMENTS = ["A: ", "{{ y }}", " ", "\n", "  ", "\t", "x", "\n  ", "{%- if x -%}", "{% if x %}", "{%+ if x %}",
             "{%- endif -%}", "{% endif %}", "{%- endif %}", "{% endif -%}", "{{- y -}}", "{{- y }}", "{{ y -}}",
             "{# c #}", "{#- c -#}", "{#- c #}", "{% set z = 1 %}", "{%- set z = 2 -%}", "B", "\n\n", " \n ",
             "{% for i in range(2) %}", "{% endfor %}", "{%- for i in range(2) -%}", "{%- endfor -%}", "{{ i }}",
             "é", "\u3000", "{% raw %}{{ raw }}{% endraw %}"]


def whitespace_cases():
    rng = random.Random(99)
    cases = {"ardanlabs_bug": "{%- if x -%}A: {{ y }}{%- endif -%}",
             "indented_blocks": "  {% if x %}\n    A\n  {% endif %}\n",
             "expr_then_block": "{{ y }}  {% if x %}B{% endif %}",
             "trailing_newline": "T\n",
             "crlf": "a\r\n  {% if x %}\r\nb\r\n  {% endif %}\r\n"}
    n = 0
    while n < 300:
        parts, depth_if, depth_for = [], 0, 0
        for _ in range(rng.randint(2, 14)):
            f = rng.choice(FRAGMENTS)
            if "endif" in f:
                if depth_if == 0:
                    continue
                depth_if -= 1
            elif "if x" in f:
                depth_if += 1
            if "endfor" in f:
                if depth_for == 0:
                    continue
                depth_for -= 1
            elif "for i" in f:
                depth_for += 1
            parts.append(f)
        parts += ["{% endif %}"] * depth_if + ["{% endfor %}"] * depth_for
        cases[f"random_{n:03d}"] = "".join(parts)
        n += 1
    return cases

# ---------------------------------------------------------------- main


def special_tokens(cfg):
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if v is not None:
            out[k] = v
    if cfg.get("additional_special_tokens") is not None:
        out["additional_special_tokens"] = [t["content"] if isinstance(t, dict) else t for t in cfg["additional_special_tokens"]]
    return out


def default_template(cfg):
    t = cfg.get("chat_template")
    if isinstance(t, list):
        t = next(x["template"] for x in t if x["name"] == "default")
    return t


def prepare(tok_dir, work):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    templates = {}
    for m in MODELS:
        cfg = json.load(open(os.path.join(tok_dir, m, "tokenizer_config.json")))
        templates[m] = {"template": default_template(cfg), "special_tokens": special_tokens(cfg)}
    templates["custom_openai"] = {"template": OPENAI_TEMPLATE, "special_tokens": {"bos_token": "<s>", "eos_token": "</s>"}}
    reqs = requests()
    meta = {"requests": reqs, "templates": {}}
    for name, t in templates.items():
        fmt = detect_content_format(env, t["template"])
        tvars = jinja2.meta.find_undeclared_variables(env.parse(t["template"]))
        convs, info = [], {}
        for r in reqs:
            try:
                conv, cfm, final = prepare_request(r["body"], fmt, tvars)
            except Exception as ex:
                info[r["name"]] = {"error": f"{type(ex).__name__}: {ex}"}
                continue
            conv["name"] = r["name"]
            convs.append(conv)
            info[r["name"]] = {"continue_final_message": cfm, "final": final}
        json.dump({name: t}, open(os.path.join(work, f"templates-{name}.json"), "w"), ensure_ascii=False)
        json.dump(convs, open(os.path.join(work, f"conversations-{name}.json"), "w"), ensure_ascii=False)
        meta["templates"][name] = {"content_format": fmt, "info": info,
                                   "custom_source": t["template"] if name == "custom_openai" else None}
    json.dump(meta, open(os.path.join(work, "meta.json"), "w"), ensure_ascii=False)
    ws = whitespace_cases()
    json.dump({k: {"template": v, "special_tokens": {}} for k, v in ws.items()},
              open(os.path.join(work, "templates-ws.json"), "w"), ensure_ascii=False)
    json.dump([{"name": "ctx", "messages": [], "add_generation_prompt": False, "kwargs": {"x": True, "y": "v"}}],
              open(os.path.join(work, "conversations-ws.json"), "w"), ensure_ascii=False)


def collect(work, out_dir):
    meta = json.load(open(os.path.join(work, "meta.json")))
    date = os.environ.get("FIXTURE_DATE", "")
    cases, renderer = [], ""
    for name, tm in meta["templates"].items():
        rendered = json.load(open(os.path.join(work, f"rendered-{name}.json")))
        renderer = rendered["renderer"]
        for r in meta["requests"]:
            info = tm["info"][r["name"]]
            case = {"template": name, "name": r["name"], "request": r["body"]}
            if "error" in info:
                case["error"] = info["error"]
            else:
                res = rendered[f"{name}/{r['name']}"]
                if "error" in res:
                    case["error"] = res["error"]
                elif info["continue_final_message"]:
                    try:
                        case["text"] = continue_final(res["text"], info["final"])
                    except ValueError as ex:
                        case["error"] = f"ValueError: {ex}"
                else:
                    case["text"] = res["text"]
            cases.append(case)
    out = {"renderer": renderer, "fixture_date": date,
           "content_formats": {n: t["content_format"] for n, t in meta["templates"].items()},
           "custom_templates": {n: t["custom_source"] for n, t in meta["templates"].items() if t["custom_source"]},
           "cases": cases}
    with open(os.path.join(out_dir, "parity.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    ws_t = json.load(open(os.path.join(work, "templates-ws.json")))
    ws_r = json.load(open(os.path.join(work, "rendered-ws.json")))
    ws = {"renderer": ws_r["renderer"], "context": {"x": True, "y": "v"},
          "cases": [{"name": k, "template": v["template"], **ws_r[f"{k}/ctx"]} for k, v in ws_t.items()]}
    with open(os.path.join(out_dir, "whitespace.json"), "w") as f:
        json.dump(ws, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"parity.json: {len(cases)} cases ({n_err} expected errors); whitespace.json: {len(ws['cases'])} cases")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "prepare":
        prepare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "collect":
        collect(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
