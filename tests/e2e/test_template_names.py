"""scripts/template_names.py on the template as SAM transforms it (no emulator needed): the
real template passes, and a template in which SAM names a resource the same in every stack
fails, naming it (#44: without a `Name`, the maintenance schedule became an
`AWS::Scheduler::Schedule` named `MaintenanceStateMachineSchedule` and a second stack in the
account and region rolled back)."""

import importlib.util
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("template_names", ROOT / "scripts" / "template_names.py")
names = importlib.util.module_from_spec(spec)
spec.loader.exec_module(names)


def test_every_name_of_the_transformed_template_is_unique_to_the_stack():
    template = names.transformed(str(ROOT / "template.yaml"))
    assert names.problems(template) == []
    schedules = [r for r in template["Resources"].values() if r["Type"] == "AWS::Scheduler::Schedule"]
    assert schedules, "the maintenance schedule is in the transformed template"


def test_a_schedule_sam_names_after_its_logical_id_fails(tmp_path):
    text = (ROOT / "template.yaml").read_text()
    start = text.index("            Name: !Sub\n              - tributary-maintenance-")
    end = text.index("            ScheduleExpression: !Ref ScheduleExpression")
    path = tmp_path / "template.yaml"
    path.write_text(text[:start] + text[end:])
    bad = names.problems(names.transformed(str(path)))
    assert any("MaintenanceStateMachineSchedule" in b and "not unique to the stack" in b for b in bad), bad
