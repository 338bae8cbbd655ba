// Evaluates IAM requests against policies with @cloud-copilot/iam-simulate (the AWS policy
// evaluation logic: identity and resource policies, explicit denies, every condition
// operator; actions, resource ARNs and condition keys validated against AWS's IAM data).
// stdin: {"requests": [{"principal", "action", "resource", "account", "context",
//          "identityPolicies": [{name, policy}], "resourcePolicy"?}]}
// stdout: [{"result": "Allowed" | "ImplicitlyDenied" | "ExplicitlyDenied" | "Error",
//           "allowedBy": [<policy name>#<statement Sid or index>], "errors"?}]
import { runSimulation } from '@cloud-copilot/iam-simulate'

const input = JSON.parse(await new Promise((resolve) => {
  let text = ''
  process.stdin.on('data', (d) => (text += d))
  process.stdin.on('end', () => resolve(text))
}))

const out = []
for (const r of input.requests) {
  const simulation = {
    request: {
      principal: r.principal,
      action: r.action,
      resource: { resource: r.resource, accountId: r.account },
      contextVariables: r.context || {}
    },
    identityPolicies: r.identityPolicies,
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    ...(r.resourcePolicy ? { resourcePolicy: r.resourcePolicy } : {})
  }
  const response = await runSimulation(simulation, {})
  if (response.resultType === 'error') {
    out.push({ result: 'Error', errors: response.errors })
    continue
  }
  const analysis = response.resultType === 'single' ? response.result.analysis : undefined
  const allowedBy = (analysis?.identityAnalysis?.allowStatements || []).map(
    (s) => `${s.policyId}#${s.explain.identifier}`
  )
  out.push({ result: response.overallResult, allowedBy })
}
process.stdout.write(JSON.stringify(out))
