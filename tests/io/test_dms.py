"""DMS tables and the variants they name (`io.dms`): every way a mutant name can be wrong says so, tables are read
with their columns' types in each format, and the reference file finds each assay's table."""

from __future__ import annotations

import gzip

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_scoring.io.dms import (
    DMSError,
    Site,
    mutated,
    numbers_of,
    parse_mutant,
    read_reference,
    read_table,
    refuse_repeats,
    strings_of,
    variant_key,
)

TARGET = "MKTAYIAK"


def test_substitutions_are_read_numbered_from_the_offset():
    assert parse_mutant("K2R", TARGET) == [Site(1, "K", "R")]
    assert parse_mutant("A4G:M1L", TARGET) == [Site(3, "A", "G"), Site(0, "M", "L")]
    assert parse_mutant("k12r", TARGET, offset=11) == [Site(1, "K", "R")]  # case-insensitive, own numbering
    assert parse_mutant("M0A", TARGET, offset=0) == [Site(0, "M", "A")]
    assert mutated(TARGET, parse_mutant("A4G:M1L", TARGET)) == "LKTGYIAK"


@pytest.mark.parametrize(
    ("mutant", "says"),
    [
        ("K3R", "residue 3 of the target is T, not K"),
        ("K9R", "position 9 of 'K9R' is outside the target (8 residues numbered from 1)"),
        ("M0A", "position 0"),
        ("K2R:K2A", "site 2 is mutated twice"),
        ("K2", "not a substitution"),
        ("K2R:", "not a substitution"),
        ("ins3G", "not a substitution"),
    ],
)
def test_a_mutant_that_cannot_be_scored_says_why(mutant, says):
    error = parse_mutant(mutant, TARGET)
    assert isinstance(error, str) and says in error


def test_tables_keep_their_types_in_every_format(tmp_path):
    rows = {"mutant": ["K2R", "A4G"], "DMS_score": [0.5, -1.25], "DMS_score_bin": [1, 0]}
    (tmp_path / "t.csv").write_text("mutant,DMS_score,DMS_score_bin\nK2R,0.5,1\nA4G,-1.25,0\n")
    with gzip.open(tmp_path / "t.csv.gz", "wt") as f:
        f.write((tmp_path / "t.csv").read_text())
    (tmp_path / "t.jsonl").write_text('{"mutant":"K2R","DMS_score":0.5,"DMS_score_bin":1}\n'
                                      '{"mutant":"A4G","DMS_score":-1.25,"DMS_score_bin":0}\n')  # fmt: skip
    pq.write_table(pa.table(rows), tmp_path / "t.parquet")
    for name in ("t.csv", "t.csv.gz", "t.jsonl", "t.parquet"):
        table = read_table(str(tmp_path / name))
        assert table.to_pydict() == rows, name
        assert table.schema.field("DMS_score").type == pa.float64()
        assert strings_of(table, "mutant") == ["K2R", "A4G"]


def test_unreadable_tables_and_repeats_are_refused(tmp_path):
    with pytest.raises(DMSError, match="must be .csv, .jsonl or .parquet"):
        read_table(str(tmp_path / "t.xlsx"))
    with pytest.raises(DMSError, match="cannot read the DMS table"):
        read_table(str(tmp_path / "missing.csv"))
    assert strings_of(pa.table({"m": ["K2R", " ", None, " A4G "]}), "m") == ["K2R", None, None, "A4G"]
    with pytest.raises(DMSError, match="'K2R' appears twice \\(again on row 3\\)"):
        refuse_repeats(["K2R", None, "K2R"], "t.csv")
    refuse_repeats(["K2R", None, None, "A4G"], "t.csv")  # rows that name no mutant are error rows, not repeats


def test_the_reference_file_names_each_assay_and_its_table(tmp_path):
    reference = tmp_path / "reference.csv"
    reference.write_text("DMS_id,DMS_filename,target_seq,taxon\nA_1,A_1.csv,MKT,Human\nB_2,B_2.csv, gsh ,Virus\n")
    assays = read_reference(str(reference), str(tmp_path / "tables"))
    assert [(a.id, a.table, a.target_seq) for a in assays] == [
        ("A_1", f"{tmp_path}/tables/A_1.csv", "MKT"),
        ("B_2", f"{tmp_path}/tables/B_2.csv", "GSH"),
    ]
    one = read_reference(str(reference), str(tmp_path / "B_2.csv"))  # one table: its own assay only
    assert [a.id for a in one] == ["B_2"]
    with pytest.raises(DMSError, match="lists no assay whose DMS_filename is 'C.csv'"):
        read_reference(str(reference), str(tmp_path / "C.csv"))
    (tmp_path / "bad.csv").write_text("DMS_id,target_seq\nA,MKT\n")
    with pytest.raises(DMSError, match="no DMS_filename column"):
        read_reference(str(tmp_path / "bad.csv"), str(tmp_path))
    (tmp_path / "twice.csv").write_text("DMS_id,DMS_filename,target_seq\nA,a.csv,MKT\nA,b.csv,MKT\n")
    with pytest.raises(DMSError, match="appear more than once"):
        read_reference(str(tmp_path / "twice.csv"), str(tmp_path))


def test_measurements_are_numbers_or_the_reason_they_are_not():
    table = pa.table({"n": [0.5, None], "s": ["1.5", " "], "w": ["high", "2"], "l": [[1], [2]]})
    assert numbers_of(table, "n") == [0.5, None]
    assert numbers_of(table, "s") == [1.5, None]  # numbers written as text; an empty cell is missing
    assert numbers_of(table, "w") == "w is not numeric: 1 of 2 values are not numbers (e.g. 'high')"
    assert numbers_of(table, "l") == "l is not numeric (its type is list<item: int64>)"


def test_an_empty_target_seq_in_the_reference_is_read_as_none_given(tmp_path):
    """Read as "" (its rows become error rows), not as the word `None` a null would print as."""
    (tmp_path / "reference.csv").write_text("DMS_id,DMS_filename,target_seq\nA,A.csv,\n")
    assert [a.target_seq for a in read_reference(str(tmp_path / "reference.csv"), str(tmp_path))] == [""]


def test_a_variant_named_twice_in_another_case_or_order_is_a_repeat():
    assert variant_key(" e1q ") == "E1Q" and variant_key("L5V:e1Q") == variant_key("E1Q:L5V") == "E1Q:L5V"
    assert variant_key("ins:K2R") == "K2R:INS"  # parts that are no substitution after the sites
    with pytest.raises(DMSError, match="the mutants 'E1Q' \\(row 1\\) and 'e1q' \\(row 3\\) name the same variant"):
        refuse_repeats(["E1Q", "K2R", "e1q"], "t.csv")
    with pytest.raises(DMSError, match="'E1Q:L5V' \\(row 1\\) and 'L5V:E1Q' \\(row 2\\)"):
        refuse_repeats(["E1Q:L5V", "L5V:E1Q"], "t.csv")
    refuse_repeats(["E1Q", "E1A", "E1Q:L5V", "L5V"], "t.csv")
