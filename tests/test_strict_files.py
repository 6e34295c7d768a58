"""Every user file parsed strictly (issue #35), by class of fault: CSV quoting, line ends, repeated ids in every
reader, control characters in ids and labels, a class named twice, a label spelled unlike its class, JSON that
json.loads reads silently or with a traceback. Each is refused in one line that names the file and line."""
import json
import re

import pytest

from albert_jax.errors import InputError, MissingFileError
from experiments import classification, glue, multiple_choice, race, token_classification
from tests.helpers import TINY_RUN, finetune_cli, spm, squad_task, task_of


def _refused(start):
  """The message's start: file, line and the problem (the fix that follows differs by class)."""
  return pytest.raises(InputError, match="^" + re.escape(start))


def _lines(*records):
  return "".join(json.dumps(r) + "\n" for r in records)


# --- CSV quoting -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, labeled, start", [
    # an unclosed quote swallowed the rest of the file: one example to predict instead of two
    ('text\n"hello\nworld\n', False, "2: not a CSV row (unexpected end of data, line 3)"),
    # two rows merged into one, which took the second row's label
    ('text,label\n"great,pos\nbad "film",neg\n', True, "2: not a CSV row (',' expected after '\"', line 3)"),
    # text after a closing quote was glued to the field: "great film"
    ('text,label\n"great" film,pos\n', True, "2: not a CSV row (',' expected after '\"', line 2)"),
    # a row of several lines is named by its first one
    ('text,label\n"two\nlines",pos,extra\n', True, "2: 3 comma-separated field(s) but the header has 2")])
def test_csv_quotes_are_read_strictly(tmp_path, text, labeled, start):
  path = tmp_path / "dev.csv"
  path.write_text(text)
  task = task_of(classification, "labels=neg|pos")
  read = task.read_examples if labeled else lambda p, labeled: task.read_user_examples(p)
  with _refused(f"{path}:{start}"):
    read(str(path), labeled=labeled)


# --- line ends -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, line", [
    ("train.tsv", "text\tlabel\rgood\tpos\rbad\tneg\r", 1),  # old Mac line ends: one line, a header of garbage
    ("train.jsonl", '{"text": "good", "label": "pos"}\r{"text": "bad", "label": "neg"}\r', 1),
    ("train.txt", "EU B-ORG\rrejects O\r", 1),  # CoNLL: the tag "O\rrejects" (a made-up class)
    ("train.tsv", "text\tlabel\ngood\tpos\nbad\r film\tneg\n", 3)])  # a stray CR inside a line
def test_a_carriage_return_that_ends_no_line_is_refused(tmp_path, name, text, line):
  (tmp_path / name).write_bytes(text.encode())
  module = token_classification if name.endswith(".txt") else classification
  with _refused(f"{tmp_path / name}:{line}: a carriage return (\\r) inside the line"):
    task_of(module, f"data={tmp_path}").labels


# --- ids unique in every reader --------------------------------------------------------------------------------

def _squad_file(path, ids):
  qas = [{"id": i, "question": "Who?", "answers": [{"text": "Tom", "answer_start": 0}]} for i in ids]
  path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "Tom ran.", "qas": qas}]}]}))


def _race_passage(path, passage_id):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({"id": passage_id, "article": "Tom ran.", "questions": ["Who ran?"],
                              "options": [["Tom", "Ann", "Bob", "Eve"]], "answers": ["A"]}))


def _squad_user(path):
  return squad_task(1).read_user_examples(str(path))


def _race_user(path):
  return task_of(race, "", max_qa_length=16).read_user_examples(str(path))


QUESTION = {"question": "Who?", "context": "Tom ran."}
OPTIONS = {"article": "Tom ran.", "question": "Who ran?", "options": ["Tom", "Ann", "Bob", "Eve"]}


@pytest.mark.parametrize("name, write, read, start", [
    # SQuAD and RACE predict kept one answer per id and reported success
    ("mine.jsonl", lambda p: p.write_text(_lines({"id": "q1", **QUESTION}, {"id": "q1", **QUESTION})), _squad_user,
     "2: id 'q1' is also the id of line 1"),
    ("mine.jsonl", lambda p: p.write_text(_lines(QUESTION, {"id": "0", **QUESTION})), _squad_user,
     "2: id '0' is also the id of line 1 (the row number of a line without id)"),
    ("dev-v1.1.json", lambda p: _squad_file(p, ["q1", "q2", "q1"]), lambda p: squad_task(1).read_examples(str(p)),
     "question #3: id 'q1' is also the id of question #1"),
    ("mine.jsonl", lambda p: p.write_text(_lines({"id": 7, **OPTIONS}, {"id": "7", **OPTIONS})), _race_user,
     "2: id '7' is also the id of line 1"),
    ("dev", lambda p: [_race_passage(p / "middle" / "1.txt", "p"), _race_passage(p / "high" / "1.txt", "p")],
     lambda p: task_of(race, "", max_qa_length=16).read_examples(str(p), labeled=True),
     "/high/1.txt:1 (question 0): id 'p-0' is also the id of {path}/middle/1.txt:1 (question 0)"),
    ("test.tsv", lambda p: p.write_text("index\tsentence\n0\ta\n1\tb\n0\tc\n"),  # GLUE's own test file: its index
     lambda p: task_of(glue, "task=sst-2").read_examples(str(p), labeled=False),
     "4: id '0' is also the id of line 2")])
def test_ids_are_unique_in_every_reader(tmp_path, name, write, read, start):
  path = tmp_path / name
  write(path)
  separator = "" if start.startswith("/") else ":"
  with _refused(f"{path}{separator}{start.format(path=path)}; give every example its own id."):
    read(path)


# --- control characters in ids and labels ----------------------------------------------------------------------

@pytest.mark.parametrize("name, text, read, start", [
    # a GLUE prediction TSV got the id raw: a row injected, the prediction given to another id
    ("mine.jsonl", _lines({"id": "a\tb", "text_a": "x"}), lambda t, p: task_of(glue, "task=sst-2")
     .read_user_examples(p), "1: id 'a\\tb' holds the control character '\\t'"),
    ("mine.jsonl", _lines({"text_a": "x"}, {"id": "a\nb", "text_a": "y"}), lambda t, p: task_of(glue, "task=sst-2")
     .read_user_examples(p), "2: id 'a\\nb' holds the control character '\\n'"),
    ("test.tsv", "index\tsentence\n7\x0b\tx\n", lambda t, p: task_of(glue, "task=sst-2")  # \v: splitlines() cuts
     .read_examples(p, labeled=False), "2: id '7\\x0b' holds the control character '\\x0b'"),
    ("dev.csv", 'key,text,label\n"k\r1",x,pos\n', lambda t, p: task_of(classification, "labels=neg|pos,id=key")
     .read_examples(p, labeled=True), "2: id 'k\\r1' holds the control character '\\r'"),
    ("train.jsonl", _lines({"text": "x", "label": "pos\u2028"}, {"text": "y", "label": "neg"}),
     lambda t, p: task_of(classification, f"data={t}").labels,
     "1: label 'pos\\u2028' holds the control character '\\u2028'"),
    ("train.txt", "EU B-ORG\nrejects O\x1c\n", lambda t, p: task_of(token_classification, f"data={t}").labels,
     "2: tag 'O\\x1c' holds the control character '\\x1c'"),
    ("dev.jsonl", _lines({"id": "\x00", "context": "c", "question": "q", "options": ["a", "b"], "answer": 0}),
     lambda t, p: task_of(multiple_choice, "", max_seq_length=128).read_examples(p, labeled=True),
     "1: id '\\x00' holds the control character '\\x00'")])
def test_ids_and_labels_with_control_characters_are_refused(tmp_path, name, text, read, start):
  (tmp_path / name).write_bytes(text.encode())
  with _refused(f"{tmp_path / name}:{start}"):
    read(tmp_path, str(tmp_path / name))


# --- class names of the config ---------------------------------------------------------------------------------

@pytest.mark.parametrize("module, labels, message", [
    (classification, "0|1|0", "data.labels=['0', '1', '0'] names '0' twice"),  # trained a phantom class
    (token_classification, "B-X|O|B-X", "data.labels=['B-X', 'O', 'B-X'] names 'B-X' twice"),
    (classification, "neg|pos|neg|pos|neg", "data.labels=['neg', 'pos', 'neg', 'pos', 'neg'] names 'neg' 3 times"),
    (classification, ("neg", "po\ts"), "data.labels name 'po\\ts' holds the control character '\\t'")])
def test_class_names_of_the_config_are_distinct_and_printable(module, labels, message):
  with _refused(message):
    task_of(module, f"labels={labels}") if isinstance(labels, str) else task_of(module, "", labels=labels)


# --- labels spelled unlike their class -------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, arg, start", [
    ("dev.tsv", "text\tlabel\na\t1\nb\t0.0\n", "labels=0|1", "3: unknown label '0.0' (did you mean '0'?)"),
    ("dev.tsv", "text\tlabel\na\t1 \n", "labels=0|1", "2: unknown label '1 ' (did you mean '1'?)"),
    ("train.tsv", "text\tlabel\na\t0\nb\t1\nc\t0 \n", "",
     "4: label '0 ' differs from label '0' (line 2) only in spacing or number format"),
    ("train.jsonl", _lines({"text": "a", "label": 1}, {"text": "b", "label": 0}, {"text": "c", "label": 1.0}), "",
     "3: label '1.0' differs from label '1' (line 1) only in spacing or number format"),
    ("SST-2/dev.tsv", "sentence\tlabel\ngood\t1.0\n", "glue", "2: unknown label '1.0' for sst-2 (did you mean '1'?)")])
def test_a_label_spelled_unlike_its_class_is_refused_naming_the_class(tmp_path, name, text, arg, start):
  path = tmp_path / name
  path.parent.mkdir(exist_ok=True)
  path.write_text(text)
  if arg == "glue":
    read = lambda: task_of(glue, "task=sst-2").read_examples(str(path), labeled=True)
  elif arg:
    read = lambda: task_of(classification, arg).read_examples(str(path), labeled=True)
  else:
    read = lambda: task_of(classification, f"data={tmp_path}").labels
  with _refused(f"{path}:{start}"):
    read()


# --- labels and ids compared as a person reads them (issue #48) ----------------------------------------------

CAFE, CAFE_DECOMPOSED = "caf\u00e9", "cafe\u0301"  # one word on screen, two strings


@pytest.mark.parametrize("name, text, read, start", [
    # each made a third class in head.json and a 3-way softmax
    ("train.jsonl", _lines({"text": "a", "label": "pos"}, {"text": "b", "label": "neg"},
                           {"text": "c", "label": "pos\u200b"}), lambda t, p: task_of(classification, f"data={t}").labels,
     "3: label 'pos\\u200b' holds the invisible format character U+200B (ZERO WIDTH SPACE), which makes it another "
     "label than the one it looks like: remove it (did you mean 'pos'?)"),
    ("train.tsv", "text\tlabel\na\tneg\nb\t\u202eneg\n", lambda t, p: task_of(classification, f"data={t}").labels,
     "3: label '\\u202eneg' holds the invisible format character U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("train.jsonl", _lines({"text": "a", "label": "x|y\u2066"}), lambda t, p: task_of(classification,
     f"multi_label=true,data={t}").labels, "1: label 'y\\u2066' holds the invisible format character U+2066 (LEFT-TO-RIGHT ISOLATE)"),
    ("train.txt", "EU B-ORG\nrejects O\ufeff\n", lambda t, p: task_of(token_classification, f"data={t}").labels,
     "2: tag 'O\\ufeff' holds the invisible format character U+FEFF (ZERO WIDTH NO-BREAK SPACE)"),
    ("SST-2/dev.tsv", "sentence\tlabel\ngood\t1\u00ad\n", lambda t, p: task_of(glue, "task=sst-2").read_examples(
        p, labeled=True), "2: label '1\\xad' holds the invisible format character U+00AD (SOFT HYPHEN)"),
    ("dev.csv", "key,text,label\nk\u200d,x,pos\n", lambda t, p: task_of(classification, "labels=neg|pos,id=key")
     .read_examples(p, labeled=True), "2: id 'k\\u200d' holds the invisible format character U+200D"),
    ("dev.jsonl", _lines({"id": CAFE, "text_a": "x"}, {"id": CAFE_DECOMPOSED, "text_a": "y"}),
     lambda t, p: task_of(glue, "task=sst-2").read_user_examples(p),
     f"2: id {CAFE_DECOMPOSED!r} is also the id of line 1 (written {CAFE!r} there, the same text in another Unicode "
     "form)")])
def test_invisible_characters_and_unicode_forms_do_not_make_another_label_or_id(tmp_path, name, text, read, start):
  path = tmp_path / name
  path.parent.mkdir(exist_ok=True)
  path.write_bytes(text.encode())
  with _refused(f"{path}:{start}"):
    read(tmp_path, str(path))


def test_a_label_in_either_unicode_form_is_one_class_and_joiners_inside_a_word_are_kept(tmp_path):
  persian = "\u0646\u06cc\u0645\u200c\u0641\u0627\u0635\u0644\u0647"  # the joiner shapes the letters beside it
  (tmp_path / "train.jsonl").write_text(_lines({"text": "a", "label": CAFE}, {"text": "b", "label": "th\u00e9"},
                                               {"text": "c", "label": CAFE_DECOMPOSED}, {"text": "d", "label": persian}))
  (tmp_path / "dev.jsonl").write_text(_lines({"text": "a", "label": CAFE_DECOMPOSED}, {"text": "b", "label": CAFE}))
  task = task_of(classification, f"data={tmp_path}")
  assert task.labels == (CAFE, "th\u00e9", persian)
  assert [ex.label for ex in task.read_examples(str(tmp_path / "dev.jsonl"), labeled=True)] == [0, 0]
  assert task_of(classification, "", labels=(CAFE_DECOMPOSED, "the")).labels == (CAFE, "the")
  with _refused(f"data.labels=[{CAFE!r}, {CAFE!r}] names {CAFE!r} twice"):
    task_of(classification, "", labels=(CAFE, CAFE_DECOMPOSED))
  with _refused("data.labels name 'neg\\u200e' holds the invisible format character U+200E (LEFT-TO-RIGHT MARK)"):
    task_of(classification, "", labels=("neg\u200e", "pos"))


def test_a_split_is_a_name_in_the_data_folder_and_a_missing_one_names_what_is_there(tmp_path):
  """--split=../../x read a file outside the data folder and wrote its predictions outside the run; a mistyped
  split, and a missing --input, blamed config.data.path (issue #48)."""
  for name in ("train.tsv", "dev.tsv", "test.tsv"):
    (tmp_path / name).write_text("text\tlabel\na\tpos\nb\tneg\n")
  task = task_of(classification, f"data={tmp_path}")
  for bad in ("../../x", "sub/test", "..", "", "/etc/passwd"):
    with _refused(f"--split={bad!r} is not a split name; name one of the task's splits"):
      task.load_split(bad, None)
  with pytest.raises(MissingFileError) as missing:
    task.load_split("tset", None)
  assert str(missing.value) == (f"split 'tset': {tmp_path / 'tset.tsv'} not found; {tmp_path} holds dev, test, train "
                                "(a split is named by its file): check the split's name, or --config.data.path.")
  with pytest.raises(MissingFileError) as missing:
    task.read_user_file(str(tmp_path / "mine.tsv"), None)
  assert str(missing.value) == (f"--input={tmp_path / 'mine.tsv'} not found; pass the file of examples to predict "
                                "(its format: docs/finetuning.md).")


def test_a_missing_or_empty_init_checkpoint_is_named_rather_than_the_empty_spm_model(tmp_path):
  from albert_jax.tasks import make_tokenizer
  config = classification.get_config("")
  config.init_checkpoint = str(tmp_path / "albert_base")
  with pytest.raises(MissingFileError) as missing:
    make_tokenizer(config)
  assert str(missing.value) == (f"init_checkpoint={tmp_path / 'albert_base'} not found, so nothing names the "
                                "SentencePiece model (config.data.spm_model is empty); pass the weights' folder (a "
                                "convert output or a training workdir), or --config.data.spm_model=PATH.")
  config.init_checkpoint = ""
  with _refused("config.data.spm_model is empty and init_checkpoint is empty (weights whose run records their "
                "SentencePiece model would name it); pass the SentencePiece model"):
    make_tokenizer(config)


# --- JSON that json.loads reads silently or with a traceback ---------------------------------------------------

def _mc(**fields):
  return {"context": "c", "question": "q", "options": ["a", "b"], "answer": 0, **fields}


@pytest.mark.parametrize("text, read, start", [
    ('{"text": "ok", "label": "pos"}\n{"text": "bad \\ud800", "label": "neg"}\n', "classification",
     "2: a lone UTF-16 surrogate \\ud800"),
    ('{"text": "ok", "label": "pos"}\n{"text": "x", "label": "neg", "\\udc00": 1}\n', "classification",
     "2: a lone UTF-16 surrogate \\udc00"),
    ('{"text": "ok", "label": "pos"}\n{"text": "x", "label": 1e999}\n', "classification",
     "2: number 1e999 is out of range"),
    ('{"text": "ok", "label": "pos"}\n{"text": "x", "label": NaN}\n', "classification",
     "2: NaN is not a JSON number"),
    (json.dumps(_mc()) + "\n" + json.dumps(_mc()).replace('"answer": 0', '"answer": ' + "9" * 5000) + "\n",
     "multiple_choice", f"2: number {'9' * 20}... (5000 characters) is out of range"),
    (json.dumps(_mc(options=["a", "b"])).replace('"b"', "-Infinity") + "\n", "multiple_choice",
     "1: -Infinity is not a JSON number"),
    # a whole-file JSON names the first line that holds the culprit
    (json.dumps({"data": [{"paragraphs": [{"context": "Tom \ud800 ran.", "qas": []}]}]}, indent=1), "squad",
     "6: a lone UTF-16 surrogate \\ud800")])
def test_json_that_loads_silently_or_with_a_traceback_is_refused(tmp_path, text, read, start):
  path = tmp_path / ("dev.json" if read == "squad" else "train.jsonl")
  path.write_text(text)
  readers = {"classification": lambda: task_of(classification, f"data={tmp_path}").labels,
             "multiple_choice": lambda: task_of(multiple_choice, "", max_seq_length=128).read_examples(
                 str(path), labeled=True),
             "squad": lambda: squad_task(1).read_examples(str(path))}
  with _refused(f"{path}:{start}"):
    readers[read]()


# --- on the command line ---------------------------------------------------------------------------------------

def test_training_on_a_csv_with_an_unclosed_quote_stops_with_one_line(shared_data, tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  (data / "train.csv").write_text('text,label\n"a good film,pos\na bad film,neg\n')
  result = finetune_cli(f"experiments/classification.py:size=tiny,data={data},spm={spm(shared_data)}",
                        tmp_path / "run", *TINY_RUN)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"error: {data / 'train.csv'}:2: not a CSV row (unexpected end of data, line 3)")


# --- SQuAD's nested layout -------------------------------------------------------------------------------------

def _with_question(question):
  return {"data": [{"paragraphs": [{"context": "Tom ran.", "qas": [question]}]}]}


@pytest.mark.parametrize("data, start", [
    ([1, 2], ": the file should be a JSON object, got list"),
    ({"version": "1.1"}, ": missing field 'data' (have ['version'])"),
    ({"data": {"title": "t"}}, ": field 'data' should be list, got dict"),
    ({"data": ["t"]}, ":article #1: an article should be a JSON object, got str"),
    ({"data": [{"title": "t"}]}, ":article #1: missing field 'paragraphs' (have ['title'])"),
    ({"data": [{"paragraphs": [{"qas": []}]}]}, ":article #1 paragraph #1: missing field 'context' (have ['qas'])"),
    (_with_question({"id": "q1", "answers": []}), ":question q1: missing field 'question' (have ['answers', 'id'])"),
    (_with_question({"id": "q1", "question": "Who?", "answers": [{"text": "Tom"}]}),
     ":question q1: missing field 'answer_start' (have ['text'])"),
    (_with_question({"id": "q1", "question": "Who?", "answers": "Tom"}),
     ":question q1: field 'answers' should be list, got str")])
def test_a_squad_file_of_another_layout_is_named_by_the_field_it_lacks(tmp_path, data, start):
  """Each level of SQuAD's layout (articles, paragraphs, questions, answers) is checked: a KeyError or TypeError
  traceback before."""
  path = tmp_path / "dev-v1.1.json"
  path.write_text(json.dumps(data))
  with _refused(f"{path}{start}"):
    squad_task(1).read_examples(str(path))


def test_a_benchmark_s_missing_data_names_its_download_command(tmp_path):
  """GLUE, SQuAD and RACE data that is not there names the command that fetches it and the data= it then takes;
  your own data (multiple choice) names data.path only."""
  from albert_jax.tasks import get_task
  from experiments import squad_v1
  missing = tmp_path / "DATA"
  cases = [(glue.get_config(f"task=rte,data={missing}/glue"), f"{missing}/glue/RTE/train.tsv", "glue", "glue"),
           (squad_v1.get_config(f"data={missing}/squad"), f"{missing}/squad/train-v1.1.json", "squad", "squad"),
           (race.get_config(f"data={missing}/RACE"), f"{missing}/RACE/train", "race", "RACE")]
  for config, path, tasks, folder in cases:
    with pytest.raises(MissingFileError) as error:
      get_task(config).load_split("train", None)
    assert str(error.value) == (f"{path} not found; download the data (python -m data_pipeline.download "
                                f"--tasks={tasks} --output=DATA) and pass data=DATA/{folder}, or check "
                                "--config.data.path.")
  own = multiple_choice.get_config(f"data={missing}/mine")
  with pytest.raises(MissingFileError) as error:
    get_task(own).load_split("train", None)
  assert "data_pipeline.download" not in str(error.value)
