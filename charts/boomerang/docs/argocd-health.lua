-- Argo CD health check for boomerang.dev/DisaggregatedDeployment.
--
-- Install it in argocd-cm under the key
--   resource.customizations.health.boomerang.dev_DisaggregatedDeployment
-- (see charts/boomerang/docs/README.md). Argo CD runs it with the live object as `obj`.
--
-- The operator's conditions decide: a status written for an older generation is Progressing
-- (the operator has not looked at the new spec yet); Degraded=True is Degraded; Ready=True is
-- Healthy; anything else (Progressing=True, or no conditions yet) is Progressing.
local hs = {status = "Progressing", message = "Waiting for the operator"}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation or 0
if (obj.status.observedGeneration or 0) < generation then
  hs.message = "The operator has not observed generation " .. generation .. " yet"
  return hs
end
local found = {}
for _, condition in ipairs(obj.status.conditions) do
  found[condition.type] = condition
end
local function describe(condition)
  return (condition.reason or "") .. ": " .. (condition.message or "")
end
if found.Degraded ~= nil and found.Degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(found.Degraded)
elseif found.Ready ~= nil and found.Ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(found.Ready)
elseif found.Progressing ~= nil and found.Progressing.status == "True" then
  hs.message = describe(found.Progressing)
elseif found.Ready ~= nil then
  hs.message = describe(found.Ready)
end
return hs
