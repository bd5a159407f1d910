-- Argo CD resource health for sandbox.iterion.io/SandboxRun (install: docs/gitops.md).
-- Argo CD runs it with the live object as the global `obj` and reads back {status, message}.
-- Written for Argo CD's Lua (5.1 semantics); tested under Debian's lua5.4 (tests/it/gitops.rs).
--
--   Healthy      the run ended well (condition Complete=True, every path drained), or a
--                long-lived sandbox (no command: neither spec.command nor, for a run made from a
--                template, the command of the template its status records) is Running
--   Degraded     the run ended badly (condition Failed=True, its reason and message), a path
--                failed to drain (Drained=False: files were lost), or the run cannot start
--                (Pending, Ready=False with a reason of the `stuck` table below: the operator's
--                own refusals and the kubelet's causes, e.g. FailedMount)
--   Progressing  everything else: not picked up yet, status of an older generation, Pending,
--                a batch workload Running, Draining, or being deleted (the finalizer drains)

local hs = {}

local function condition(status, type_)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local function says(c)
  if c == nil then
    return ""
  end
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    if text ~= "" then
      text = text .. ": "
    end
    text = text .. c.message
  end
  return text
end

-- The Ready reasons of a Pending run that cannot start until someone acts: exactly the
-- operator's list (cannot_start_reasons in src/controller/run/status/tracked.rs; a unit test
-- compares this line with it). PodPending and PodCreated are a pod still starting.
local stuck = { PodCreateFailed = true, Unschedulable = true, ImagePullFailed = true, EgressNotEnforced = true, InvalidSpec = true, RightsUnverified = true, StoreUnusable = true, TemplateUnusable = true, EgressPolicyUnenforced = true, CreateContainerConfigError = true, CreateContainerError = true, RunContainerError = true, FailedMount = true, FailedAttachVolume = true, FailedCreatePodSandBox = true }

local status = obj.status
local phase = status and status.phase or nil

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "being deleted: the finalizer drains the read-back paths first"
  return hs
end

if phase == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to pick the run up"
  return hs
end

if obj.metadata ~= nil and obj.metadata.generation ~= nil and status.observedGeneration ~= nil
    and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "the operator has not observed generation " .. tostring(obj.metadata.generation) .. " yet"
  return hs
end

local failed = condition(status, "Failed")
local complete = condition(status, "Complete")
local drained = condition(status, "Drained")

if (failed ~= nil and failed.status == "True") or phase == "Failed" then
  hs.status = "Degraded"
  hs.message = says(failed)
  if hs.message == "" then
    hs.message = status.message or "run failed"
  end
  return hs
end

if drained ~= nil and drained.status == "False" and phase ~= "Draining" then
  hs.status = "Degraded"
  hs.message = says(drained)
  return hs
end

if (complete ~= nil and complete.status == "True") or phase == "Succeeded" or phase == "Stopped" then
  hs.status = "Healthy"
  hs.message = status.message or phase
  return hs
end

-- A run made from a template runs the template's command unless it sets its own: the operator
-- records the template (status.template.spec.template) before the pod exists.
local function has_command(spec)
  return spec ~= nil and spec.command ~= nil and #spec.command > 0
end

if phase == "Running" then
  local recorded = status.template and status.template.spec and status.template.spec.template or nil
  if not has_command(obj.spec) and not has_command(recorded) then
    hs.status = "Healthy"
    hs.message = "long-lived sandbox running (set spec.stop: true to drain and release it)"
  else
    hs.status = "Progressing"
    hs.message = status.message or "workload running"
  end
  return hs
end

local ready = condition(status, "Ready")
if phase == "Pending" and ready ~= nil and ready.status == "False" and stuck[ready.reason or ""] then
  hs.status = "Degraded"
  hs.message = says(ready)
  return hs
end

hs.status = "Progressing"
hs.message = status.message or phase
return hs
